//! The report's SVG chart: four panels over the seconds of the run — users waiting (the
//! simulator's count, and `/stats` where sampled); admissions and purchases reaching the backend
//! per second against the budget line; poll latency p50, p95 and p99 (gaps where nobody polled);
//! enters, polls and errors per second.

use std::path::Path;

use plotters::prelude::*;

use super::report::{Report, Second};

const BLUE: RGBColor = RGBColor(31, 119, 180);
const ORANGE: RGBColor = RGBColor(255, 127, 14);
const GREEN: RGBColor = RGBColor(44, 160, 44);
const RED: RGBColor = RGBColor(214, 39, 40);
const GREY: RGBColor = RGBColor(110, 110, 110);

/// A named series: its value in a second, `None` where it has none (drawn as a gap).
type Line<'a> = (&'a str, RGBColor, Box<dyn Fn(&Second) -> Option<f64> + 'a>);

fn panel(
    area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    title: &str,
    unit: &str,
    series: &[Second],
    lines: Vec<Line<'_>>,
) -> Result<(), String> {
    let x_max = series.len().max(2) as f64 - 1.0;
    let y_max = series
        .iter()
        .flat_map(|s| lines.iter().filter_map(move |(_, _, f)| f(s)))
        .fold(1.0f64, f64::max)
        * 1.1;
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 18))
        .margin(8)
        .x_label_area_size(28)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..x_max, 0f64..y_max)
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc("seconds")
        .y_desc(unit)
        .light_line_style(WHITE.mix(0.0))
        .draw()
        .map_err(|e| e.to_string())?;
    for (name, color, f) in lines {
        // One line per run of seconds that have a value.
        let mut runs: Vec<Vec<(f64, f64)>> = vec![Vec::new()];
        for s in series {
            match f(s) {
                Some(y) => {
                    if let Some(run) = runs.last_mut() {
                        run.push((s.t_s as f64, y));
                    }
                }
                None => runs.push(Vec::new()),
            }
        }
        runs.retain(|r| !r.is_empty());
        let mut drawn = None;
        for run in runs {
            drawn = Some(
                chart
                    .draw_series(LineSeries::new(run, color.stroke_width(2)))
                    .map_err(|e| e.to_string())?,
            );
        }
        let Some(drawn) = drawn else { continue };
        drawn.label(name).legend(move |(x, y)| {
            PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2))
        });
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.3))
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(|e| e.to_string())
}

/// Draws the chart of `report` into `path`.
pub fn draw(report: &Report, path: &Path) -> Result<(), String> {
    let root = SVGBackend::new(path, (1000, 1100)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let (head, body) = root.split_vertically(40);
    head.draw(&Text::new(
        format!(
            "{} — spike {:.0}/s for {:.0} s, batch {} per {} ms",
            report.sales.join(", "),
            report.profile.spike_rate,
            report.profile.spike_s,
            report.profile.batch,
            report.profile.tick_ms
        ),
        (10, 12),
        ("sans-serif", 20),
    ))
    .map_err(|e| e.to_string())?;
    let panels = body.split_evenly((4, 1));
    let s = &report.series;
    let count = |v: u64| Some(v as f64);
    let waiting: Vec<Line<'_>> = vec![
        (
            "waiting (simulator)",
            BLUE,
            Box::new(move |x| count(x.waiting)),
        ),
        (
            "waiting (/stats)",
            ORANGE,
            Box::new(|x| x.waiting_server.map(|w| w as f64)),
        ),
    ];
    panel(&panels[0], "Users waiting", "users", s, waiting)?;
    let purchases = if report.backend.source == "record-backend" {
        "purchases at the backend/s"
    } else {
        "purchases answered 2xx/s (simulator)"
    };
    panel(
        &panels[1],
        "Admissions and purchases against the budget",
        "per second",
        s,
        vec![
            ("admissions/s", BLUE, Box::new(move |x| count(x.admissions))),
            (purchases, GREEN, Box::new(move |x| count(x.purchases))),
            ("budget/s", RED, Box::new(|x| Some(x.budget))),
        ],
    )?;
    // A second without polls has no latency: a gap, not a zero.
    let latency = |v: f64, polls: u64| (polls > 0).then_some(v);
    panel(
        &panels[2],
        "Poll latency",
        "ms",
        s,
        vec![
            (
                "p50",
                BLUE,
                Box::new(move |x| latency(x.poll_p50_ms, x.polls)),
            ),
            (
                "p95",
                ORANGE,
                Box::new(move |x| latency(x.poll_p95_ms, x.polls)),
            ),
            (
                "p99",
                RED,
                Box::new(move |x| latency(x.poll_p99_ms, x.polls)),
            ),
        ],
    )?;
    panel(
        &panels[3],
        "Requests",
        "per second",
        s,
        vec![
            ("enters/s", BLUE, Box::new(move |x| count(x.enters))),
            ("polls/s", GREY, Box::new(move |x| count(x.polls))),
            (
                "errors/s (5xx, no answer)",
                RED,
                Box::new(move |x| count(x.errors)),
            ),
        ],
    )?;
    root.present().map_err(|e| e.to_string())
}
