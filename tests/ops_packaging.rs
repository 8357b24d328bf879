//! What ops load next to the gateway, checked with the real tools: the Prometheus alert rules
//! (`promtool check rules`, and `promtool test rules` firing each alert on synthetic series) and
//! the Grafana dashboard (every query is valid PromQL, checked by promtool as a recording rule).
//! Both may only use metrics the gateway exports.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use common::TempDir;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn promtool(args: &[&str]) -> String {
    let out = Command::new("promtool")
        .args(args)
        .current_dir(root())
        .output()
        .expect("promtool must be installed (apt-get install prometheus)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?}:\n{text}");
    text
}

/// The metric names the gateway registers (`src/metrics.rs`).
fn exported() -> BTreeSet<String> {
    let src = std::fs::read_to_string(root().join("src/metrics.rs")).unwrap();
    let names = metric_names(&src);
    assert!(names.len() >= 15, "{names:?}");
    names
}

/// Every `virtual_queue_*` / `vq_gateway_*` name in `text` (histogram series suffixes removed).
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for prefix in ["virtual_queue_", "vq_gateway_"] {
        let mut rest = text;
        while let Some(i) = rest.find(prefix) {
            let tail = &rest[i..];
            let end = tail
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(tail.len());
            let name = &tail[..end];
            let name = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s))
                .unwrap_or(name);
            names.insert(name.to_string());
            rest = &tail[end..];
        }
    }
    names
}

#[test]
fn alert_rules_pass_promtool_and_every_alert_fires_in_its_unit_test() {
    let checked = promtool(&["check", "rules", "docker/alerts.yml"]);
    assert!(checked.contains("SUCCESS: 8 rules found"), "{checked}");
    let tested = promtool(&["test", "rules", "docker/alerts.test.yml"]);
    assert!(tested.contains("SUCCESS"), "{tested}");
    // Every alert of the rules file has a unit test that expects it to fire.
    let rules = std::fs::read_to_string(root().join("docker/alerts.yml")).unwrap();
    let tests = std::fs::read_to_string(root().join("docker/alerts.test.yml")).unwrap();
    for line in rules.lines() {
        if let Some(name) = line.trim().strip_prefix("- alert: ") {
            assert!(
                tests.contains(&format!(
                    "alertname: {name}\n        exp_alerts:\n          - "
                )),
                "no unit test fires {name}"
            );
        }
    }
    let unknown: Vec<String> = metric_names(&rules)
        .difference(&exported())
        .cloned()
        .collect();
    assert!(
        unknown.is_empty(),
        "alerts use metrics nobody exports: {unknown:?}"
    );
}

#[test]
fn the_dashboard_queries_are_valid_promql_over_exported_metrics() {
    let text = std::fs::read_to_string(root().join("docker/grafana-dashboard.json")).unwrap();
    let dash: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut exprs = Vec::new();
    for panel in dash["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            exprs.push(target["expr"].as_str().unwrap().to_string());
        }
    }
    assert!(exprs.len() >= 10, "{exprs:?}");
    // The dashboard's two variables, as the gateway's defaults.
    let dir = TempDir::new("dashboard");
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (i, e) in exprs.iter().enumerate() {
        let e = e.replace("$batch_size", "100").replace("$tick_ms", "2000");
        rules.push_str(&format!(
            "      - record: dashboard:query{i}\n        expr: {}\n",
            serde_json::to_string(&e).unwrap()
        ));
    }
    let path = dir.0.join("dashboard.rules.yml");
    std::fs::write(&path, rules).unwrap();
    let checked = promtool(&["check", "rules", path.to_str().unwrap()]);
    assert!(
        checked.contains(&format!("SUCCESS: {} rules found", exprs.len())),
        "{checked}"
    );
    let unknown: Vec<String> = metric_names(&exprs.join("\n"))
        .difference(&exported())
        .cloned()
        .collect();
    assert!(
        unknown.is_empty(),
        "the dashboard uses metrics nobody exports: {unknown:?}"
    );
}
