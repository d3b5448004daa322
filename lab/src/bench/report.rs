//! The benchmark's report: a markdown table with ratios, target checks, and an SVG chart.

use super::child::{Launch, Scenario};
use plotters::prelude::*;
use std::path::Path;

/// Median, min and max of one measure over a scenario's launches.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spread {
    /// The middle value (the upper of the two for an even count), in the measure's unit.
    pub median: f64,
    /// The smallest value, in the measure's unit.
    pub min: f64,
    /// The largest value, in the measure's unit.
    pub max: f64,
}

/// The spread of `values`; all NaN when there are none.
pub fn spread(values: impl Iterator<Item = f64>) -> Spread {
    let mut v: Vec<f64> = values.collect();
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return Spread {
            median: f64::NAN,
            min: f64::NAN,
            max: f64::NAN,
        };
    }
    Spread {
        median: v[v.len() / 2],
        min: v[0],
        max: v[v.len() - 1],
    }
}

/// One scenario's launches: a row of the report.
pub struct Row {
    /// The scenario launched.
    pub scenario: Scenario,
    /// Its launches' measurements, in the order they ran.
    pub launches: Vec<Launch>,
}

impl Row {
    /// The spread over the launches of the measure `f` picks (`|l| l.ready`).
    pub fn of(&self, f: impl Fn(&Launch) -> f64) -> Spread {
        spread(self.launches.iter().map(f))
    }
}

fn find(rows: &[Row], s: Scenario) -> Option<&Row> {
    rows.iter().find(|r| r.scenario == s)
}

/// The markdown report: the table, then each target with its verdict.
pub fn markdown(title: &str, rows: &[Row], cache_file: u64, reload: Option<&str>) -> String {
    let mut out = format!("### {title}\n\n");
    out.push_str("| scenario | load-to-ready ms (median, min-max) | open | create | finalize | 1st inference | peak RSS MiB | weight file resident MiB | cache file resident MiB | packed | vs no-cache | vs floor |\n");
    out.push_str("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    let ready = |s| find(rows, s).map(|r| r.of(|l| l.ready).median);
    let base = ready(Scenario::NoCache);
    let floor = ready(Scenario::Floor);
    for r in rows {
        let rd = r.of(|l| l.ready);
        let ratio = |b: Option<f64>| b.map_or("-".into(), |b| format!("{:.2}x", rd.median / b));
        let packed = r.of(|l| l.packed as f64).median;
        let packed = if packed >= usize::MAX as f64 {
            "-".to_string()
        } else {
            format!("{packed:.0}")
        };
        out.push_str(&format!(
            "| {} | {:.2} ({:.2}-{:.2}) | {:.2} | {:.2} | {:.2} | {:.2} | {:.0} | {:.1} | {:.1} | {} | {} | {} |\n",
            r.scenario.name(),
            rd.median,
            rd.min,
            rd.max,
            r.of(|l| l.open).median,
            r.of(|l| l.create).median,
            r.of(|l| l.finalize).median,
            r.of(|l| l.infer).median,
            r.of(|l| l.peak_rss).median,
            r.of(|l| l.weights_resident).median,
            r.of(|l| l.packed_resident).median,
            packed,
            ratio(base),
            ratio(floor),
        ));
    }
    out.push_str(&format!(
        "\ncache file: {cache_file} bytes ({:.1} MiB)\n",
        cache_file as f64 / (1 << 20) as f64
    ));
    if let Some(reload) = reload {
        out.push_str(&format!("reload cycles: {reload}\n"));
    }
    let sums: Vec<f64> = rows
        .iter()
        .filter_map(|r| r.launches.first())
        .map(|l| l.checksum)
        .collect();
    let identical = sums.windows(2).all(|w| w[0] == w[1]);
    out.push_str(&format!(
        "outputs identical across scenarios: {identical}\n\n"
    ));
    out.push_str(&targets(rows, cache_file, reload));
    out
}

fn verdict(ok: bool) -> &'static str {
    if ok { "met" } else { "NOT met" }
}

/// The targets, each with its measured value.
fn targets(rows: &[Row], cache_file: u64, reload: Option<&str>) -> String {
    let ready = |s| find(rows, s).map(|r| r.of(|l| l.ready).median);
    let mut out = String::from("Targets:\n");
    let baseline = match (ready(Scenario::NoCache), ready(Scenario::XnnpackCache)) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    if let (Some(warm), Some(base)) = (ready(Scenario::Warm), baseline) {
        let x = base / warm;
        out.push_str(&format!(
            "- warm {x:.0}x faster than the faster baseline (target >= 100x): {}\n",
            verdict(x >= 100.0)
        ));
    }
    if let (Some(warm), Some(floor)) = (ready(Scenario::Warm), ready(Scenario::Floor)) {
        let x = warm / floor;
        out.push_str(&format!(
            "- warm {x:.2}x the floor (target <= 3x): {}\n",
            verdict(x <= 3.0)
        ));
    }
    if let (Some(cold), Some(base)) = (ready(Scenario::Cold), baseline) {
        let x = cold / base;
        out.push_str(&format!(
            "- cold {x:.2}x the faster baseline (target <= 1.10x): {}\n",
            verdict(x <= 1.10)
        ));
    }
    if let Some(warm) = find(rows, Scenario::Warm) {
        let rss = warm.of(|l| l.peak_rss).median;
        let limit = cache_file as f64 / (1 << 20) as f64 + 32.0;
        let unpacked = warm.of(|l| l.weights_resident).median;
        // Quantization scales are read to define the graph; weights must not be (1% allowed).
        let weights = find(rows, Scenario::NoCache)
            .map_or(f64::INFINITY, |r| r.of(|l| l.weights_resident).median);
        out.push_str(&format!(
            "- warm peak RSS {rss:.0} MiB (target <= packed {:.0} + 32 MiB), unpacked weights resident {unpacked:.1} MiB of {weights:.0}: {}\n",
            limit - 32.0,
            verdict(rss <= limit && unpacked <= weights * 0.01)
        ));
    }
    if let Some(r) = reload {
        let ok = r.contains("growth=0 ") && r.contains("mtime_unchanged=true");
        out.push_str(&format!(
            "- 0 bytes of growth and unchanged mtime over reload cycles: {}\n",
            verdict(ok)
        ));
    }
    out
}

/// Two bar charts side by side: load-to-ready (log scale) and peak RSS.
pub fn svg(path: &Path, title: &str, rows: &[Row]) -> Result<(), String> {
    let root = SVGBackend::new(path, (1000, 420)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let root = root
        .titled(title, ("sans-serif", 18))
        .map_err(|e| e.to_string())?;
    let (left, right) = root.split_horizontally(500);
    let names: Vec<&str> = rows.iter().map(|r| r.scenario.name()).collect();
    let n = rows.len() as i32;

    let ready: Vec<f64> = rows
        .iter()
        .map(|r| r.of(|l| l.ready).median.max(0.01))
        .collect();
    let top = ready.iter().cloned().fold(1.0, f64::max) * 2.0;
    let mut chart = ChartBuilder::on(&left)
        .margin(10)
        .x_label_area_size(60)
        .y_label_area_size(60)
        .caption("load-to-ready (ms, log)", ("sans-serif", 14))
        .build_cartesian_2d((0..n).into_segmented(), (0.01f64..top).log_scale())
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_label_formatter(&|x| match x {
            SegmentValue::CenterOf(i) => names.get(*i as usize).unwrap_or(&"").to_string(),
            _ => String::new(),
        })
        .draw()
        .map_err(|e| e.to_string())?;
    chart
        .draw_series(ready.iter().enumerate().map(|(i, v)| {
            let i = i as i32;
            Rectangle::new(
                [
                    (SegmentValue::Exact(i), 0.01),
                    (SegmentValue::Exact(i + 1), *v),
                ],
                BLUE.mix(0.6).filled(),
            )
        }))
        .map_err(|e| e.to_string())?;

    let rss: Vec<f64> = rows.iter().map(|r| r.of(|l| l.peak_rss).median).collect();
    let top = rss.iter().cloned().fold(1.0, f64::max) * 1.2;
    let mut chart = ChartBuilder::on(&right)
        .margin(10)
        .x_label_area_size(60)
        .y_label_area_size(60)
        .caption("peak RSS (MiB)", ("sans-serif", 14))
        .build_cartesian_2d((0..n).into_segmented(), 0f64..top)
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_label_formatter(&|x| match x {
            SegmentValue::CenterOf(i) => names.get(*i as usize).unwrap_or(&"").to_string(),
            _ => String::new(),
        })
        .draw()
        .map_err(|e| e.to_string())?;
    chart
        .draw_series(rss.iter().enumerate().map(|(i, v)| {
            let i = i as i32;
            Rectangle::new(
                [
                    (SegmentValue::Exact(i), 0.0),
                    (SegmentValue::Exact(i + 1), *v),
                ],
                RED.mix(0.6).filled(),
            )
        }))
        .map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())
}
