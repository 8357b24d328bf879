//! The report's SVG chart: four panels over the seconds of the run — users waiting; admissions
//! and purchases reaching the backend per second against the budget line; poll latency p50, p95
//! and p99; enters, polls and errors per second.

use std::path::Path;

use plotters::prelude::*;

use super::report::{Report, Second};

const BLUE: RGBColor = RGBColor(31, 119, 180);
const ORANGE: RGBColor = RGBColor(255, 127, 14);
const GREEN: RGBColor = RGBColor(44, 160, 44);
const RED: RGBColor = RGBColor(214, 39, 40);
const GREY: RGBColor = RGBColor(110, 110, 110);

type Line<'a> = (&'a str, RGBColor, Box<dyn Fn(&Second) -> f64 + 'a>);

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
        .flat_map(|s| lines.iter().map(move |(_, _, f)| f(s)))
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
        chart
            .draw_series(LineSeries::new(
                series.iter().map(|s| (s.t_s as f64, f(s))),
                color.stroke_width(2),
            ))
            .map_err(|e| e.to_string())?
            .label(name)
            .legend(move |(x, y)| {
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
    let has_server = s.iter().any(|x| x.waiting_server.is_some());
    let mut waiting: Vec<Line<'_>> =
        vec![("waiting (simulator)", BLUE, Box::new(|x| x.waiting as f64))];
    if has_server {
        waiting.push((
            "waiting (/stats)",
            ORANGE,
            Box::new(|x| x.waiting_server.unwrap_or(0) as f64),
        ));
    }
    panel(&panels[0], "Users waiting", "users", s, waiting)?;
    panel(
        &panels[1],
        "Admissions and backend purchases against the budget",
        "per second",
        s,
        vec![
            ("admissions/s", BLUE, Box::new(|x| x.admissions as f64)),
            (
                "purchases at the backend/s",
                GREEN,
                Box::new(|x| x.purchases as f64),
            ),
            ("budget/s", RED, Box::new(|x| x.budget)),
        ],
    )?;
    panel(
        &panels[2],
        "Poll latency",
        "ms",
        s,
        vec![
            ("p50", BLUE, Box::new(|x| x.poll_p50_ms)),
            ("p95", ORANGE, Box::new(|x| x.poll_p95_ms)),
            ("p99", RED, Box::new(|x| x.poll_p99_ms)),
        ],
    )?;
    panel(
        &panels[3],
        "Requests",
        "per second",
        s,
        vec![
            ("enters/s", BLUE, Box::new(|x| x.enters as f64)),
            ("polls/s", GREY, Box::new(|x| x.polls as f64)),
            (
                "errors/s (5xx, no answer)",
                RED,
                Box::new(|x| x.errors as f64),
            ),
        ],
    )?;
    root.present().map_err(|e| e.to_string())
}
