//! The peer bench's report: its JSON, its markdown tables, ratios and target verdicts, and its
//! chart.

use super::{CacheUse, LOAD_MODES, Measured, PeerFailure, PeerResult, SCENARIOS};
use crate::bench::report::Spread;
use plotters::prelude::*;
use serde_json::json;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::Path;

/// The results as `peer.json`: `results`, one object per model, load mode and scenario, with
/// the median, min and max of each timed measure.
pub fn to_json(results: &[PeerResult], failures: &[PeerFailure], repeats: usize) -> String {
    // Three decimals: a microsecond, a KiB; more digits are noise.
    let round = |x: f64| (x * 1000.0).round() / 1000.0;
    let s =
        |s: Spread| json!({"median": round(s.median), "min": round(s.min), "max": round(s.max)});
    let rows: Vec<_> = results
        .iter()
        .map(|r| {
            let m = &r.measured;
            json!({
                "model": r.model,
                "weights_mib": round(r.weights_mib),
                "exported": r.exported,
                "decode_steps": r.decode_steps,
                "load_mode": r.load_mode,
                "scenario": r.scenario.name,
                "load_to_ready_ms": s(m.load_to_ready_ms),
                "first_execute_ms": s(m.first_execute_ms),
                "steady_execute_ms": s(m.steady_execute_ms),
                "first_output_ms": s(m.first_output_ms),
                "peak_rss_mib": round(m.peak_rss_mib.median),
                "load_anon_mib": round(m.load_anon_mib.median),
                "load_file_mib": round(m.load_file_mib.median),
                "read_during_load_mib": round(m.read_mib.median),
                "disk_read_during_load_mib": round(m.disk_read_mib.median),
                "cache_file_mib": round(m.cache_file_mib),
                "floor_ms": m.floor_ms.map(s),
            })
        })
        .collect();
    let failed: Vec<_> = failures
        .iter()
        .map(|f| {
            json!({
                "model": f.model,
                "load_mode": f.load_mode,
                "scenario": f.scenario.name,
                "reason": f.reason,
            })
        })
        .collect();
    serde_json::to_string_pretty(
        &json!({ "repeats": repeats, "results": rows, "failures": failed }),
    )
    .unwrap_or_default()
}

/// The results of one model under one load mode, by scenario name.
fn group<'a>(
    results: &'a [PeerResult],
    model: &str,
    mode: &str,
) -> HashMap<&'static str, &'a Measured> {
    results
        .iter()
        .filter(|r| r.model == model && r.load_mode == mode)
        .map(|r| (r.scenario.name, &r.measured))
        .collect()
}

/// The models of `results`, in the order they ran.
fn models(results: &[PeerResult]) -> Vec<(String, f64)> {
    let mut out: Vec<(String, f64)> = Vec::new();
    for r in results {
        if !out.iter().any(|(m, _)| *m == r.model) {
            out.push((r.model.clone(), r.weights_mib));
        }
    }
    out
}

/// The table, the ratios, and each of the targets with its verdict.
pub fn markdown(results: &[PeerResult], failures: &[PeerFailure], repeats: usize) -> String {
    let mut md = format!(
        "Each cell: median (min-max) of {repeats} fresh processes; ms unless named.\n\n\
         | model | load mode | scenario | load-to-ready ms | first execute ms | steady execute ms | first output ms | peak RSS MiB | anon / file RSS after load MiB | read() during load MiB | from disk during load MiB | cache file MiB |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|\n"
    );
    let cell = |s: Spread| {
        let d = if s.median < 10.0 { 2 } else { 1 };
        format!("{:.d$} ({:.d$}-{:.d$})", s.median, s.min, s.max)
    };
    for r in results {
        let m = &r.measured;
        let _ = writeln!(
            md,
            "| {} ({:.0} MiB) | {} | {} | {} | {} | {} | {} | {:.0} | {:.0} / {:.0} | {:.1} | {:.1} | {:.1} |",
            r.model,
            r.weights_mib,
            r.load_mode,
            r.scenario.name,
            cell(m.load_to_ready_ms),
            cell(m.first_execute_ms),
            cell(m.steady_execute_ms),
            cell(m.first_output_ms),
            m.peak_rss_mib.median,
            m.load_anon_mib.median,
            m.load_file_mib.median,
            m.read_mib.median,
            m.disk_read_mib.median,
            m.cache_file_mib
        );
    }
    md.push_str("\nRatios of medians (ExecuTorch's / xnnblob's: above 1, xnnblob is faster):\n\n");
    let mut verdicts = String::new();
    let mut verdict = |what: String, ratio: f64, limit: f64| {
        let met = ratio <= limit;
        let _ = writeln!(
            verdicts,
            "- {what}: {ratio:.3} (target <= {limit}): {}",
            if met { "met" } else { "NOT met" }
        );
    };
    for (model, _) in models(results) {
        let first = results.iter().find(|r| r.model == model);
        let exported = first.is_some_and(|r| r.exported);
        let steps = first.map_or(1, |r| r.decode_steps);
        for mode in LOAD_MODES {
            let g = group(results, &model, mode);
            let ready = |name: &str| g.get(name).map(|m| m.load_to_ready_ms.median);
            let first_output = |name: &str| g.get(name).map(|m| m.first_output_ms.median);
            let (Some(none), Some(xb_cold), Some(xb_warm)) = (
                g.get("executorch, no cache"),
                ready("xnnblob, cold"),
                ready("xnnblob, warm"),
            ) else {
                continue;
            };
            let et_none = none.load_to_ready_ms.median;
            // Where ExecuTorch's cache failed on the program, its warm launch is the one
            // without a cache: what an app that ships ExecuTorch's backend gets.
            let (et_warm_m, et_warm_is) = match g.get("executorch cache, warm") {
                Some(m) => (*m, "ExecuTorch's warm"),
                None => (*none, "ExecuTorch without a cache (its cache failed)"),
            };
            let et_warm = et_warm_m.load_to_ready_ms.median;
            let et_cold = ready("executorch cache, cold");
            let et_disk = first_output("executorch cache, warm, cold page cache");
            let xb_disk = first_output("xnnblob, warm, cold page cache");
            let ratio = |r: Option<f64>| r.map_or("-".to_string(), |r| format!("{r:.1}x"));
            let _ = writeln!(
                md,
                "- {model} ({mode}): warm {:.1}x against {et_warm_is}; cold {} against ExecuTorch's cold with its cache, {:.1}x against no cache; first output after a warm launch from disk {}",
                et_warm / xb_warm,
                ratio(et_cold.map(|c| c / xb_cold)),
                et_none / xb_cold,
                ratio(et_disk.zip(xb_disk).map(|(e, x)| e / x))
            );
            // Issue 16's targets for the generated models; issue 39's for ExecuTorch's exports
            // (the LLM the project exists for), under both loaders.
            let warm_limit = match (mode, exported) {
                (_, true) => 0.7,
                ("mmap", _) => 0.5,
                _ => 0.01,
            };
            let (cold_limit, none_limit) = if exported { (0.5, 0.8) } else { (0.4, 0.7) };
            verdict(
                format!("{model} ({mode}): warm load-to-ready / {et_warm_is}"),
                xb_warm / et_warm,
                warm_limit,
            );
            if let Some(et_cold) = et_cold {
                verdict(
                    format!("{model} ({mode}): cold / ExecuTorch's cold with its cache"),
                    xb_cold / et_cold,
                    cold_limit,
                );
            }
            verdict(
                format!("{model} ({mode}): cold / ExecuTorch without a cache"),
                xb_cold / et_none,
                none_limit,
            );
            if let (true, Some(xb), Some(et)) = (
                exported,
                g.get("xnnblob, cold"),
                g.get("executorch cache, cold"),
            ) {
                verdict(
                    format!(
                        "{model} ({mode}): cold peak RSS {:.0} MiB / ExecuTorch's cold {:.0} MiB",
                        xb.peak_rss_mib.median, et.peak_rss_mib.median
                    ),
                    xb.peak_rss_mib.median / et.peak_rss_mib.median,
                    1.0,
                );
            }
            if let (true, Some(xb), Some(et)) = (
                exported,
                g.get("xnnblob, warm"),
                g.get("executorch cache, warm"),
            ) {
                // Issue 39: what a phone counts against the app is its anonymous memory.
                verdict(
                    format!(
                        "{model} ({mode}): anonymous memory after a warm load {:.0} MiB / ExecuTorch's {:.0} MiB",
                        xb.load_anon_mib.median, et.load_anon_mib.median
                    ),
                    xb.load_anon_mib.median / et.load_anon_mib.median.max(1.0),
                    1.0,
                );
            }
            if steps > 1
                && let (Some(xb), Some(et)) =
                    (g.get("xnnblob, warm"), g.get("executorch cache, warm"))
            {
                let _ = writeln!(
                    md,
                    "- {model} ({mode}): decode per token (median execute of {steps} tokens and the first token's repeats) {:.2} ms, ExecuTorch's {:.2} ms",
                    xb.steady_execute_ms.median, et.steady_execute_ms.median
                );
            }
            if let (Some(cold), Some(warm)) = (g.get("xnnblob, cold"), g.get("xnnblob, warm")) {
                // The cache file holds the packed weights (and a small index).
                let budget = warm.cache_file_mib + 64.0;
                verdict(
                    format!(
                        "{model} ({mode}): cold peak RSS {:.0} MiB / (packed {:.0} MiB + 64 MiB)",
                        cold.peak_rss_mib.median, warm.cache_file_mib
                    ),
                    cold.peak_rss_mib.median / budget,
                    1.0,
                );
            }
            if let (Some(et_disk), Some(xb_disk)) = (et_disk, xb_disk) {
                verdict(
                    format!("{model} ({mode}): first output from a cold page cache / ExecuTorch's"),
                    xb_disk / et_disk,
                    0.8,
                );
            }
            if let Some(floor) = g.get("xnnblob, warm").and_then(|m| m.floor_ms) {
                // Issue 61: against what no backend avoids in the same launches.
                verdict(
                    format!(
                        "{model} ({mode}): warm load-to-ready / the floor ({:.2} ms: ExecuTorch's method load, its thread pool, XNNPACK's runtime creation)",
                        floor.median
                    ),
                    xb_warm / floor.median,
                    1.2,
                );
            }
            if let Some(xb) = g.get("xnnblob, warm") {
                let et = et_warm_m;
                // Issue 61: the execute right after a warm load (XNNPACK's first-run setup,
                // the first touch of each packed page) is what an app's first output waits on.
                verdict(
                    format!("{model} ({mode}): first execute after a warm load / {et_warm_is}"),
                    xb.first_execute_ms.median / et.first_execute_ms.median,
                    1.0,
                );
                // ExecuTorch's launches that packed run their tokens on the same packed weights
                // as its warm ones: how far apart its own medians land, next to the ratio.
                let itself = g.get("executorch cache, cold").map_or(String::new(), |c| {
                    let ratio = c.steady_execute_ms.median / et.steady_execute_ms.median;
                    format!(
                        " (ExecuTorch's launches that packed against its warm ones: {:.3})",
                        ratio.max(1.0 / ratio)
                    )
                });
                verdict(
                    format!("{model} ({mode}): steady execute, idle / {et_warm_is}{itself}"),
                    xb.steady_execute_ms.median / et.steady_execute_ms.median,
                    1.0,
                );
            }
            if let (true, Some(et), Some(xb)) = (
                exported,
                g.get("executorch cache, cold"),
                g.get("xnnblob, cold"),
            ) {
                // Issue 39: the tokens of the launch that packs, while its save runs.
                verdict(
                    format!(
                        "{model} ({mode}): steady execute in the launch that packs / ExecuTorch's"
                    ),
                    xb.steady_execute_ms.median / et.steady_execute_ms.median,
                    1.05,
                );
            }
            if let (Some(et), Some(xb)) = (
                g.get("executorch cache, warm, busy cores"),
                g.get("xnnblob, warm, busy cores"),
            ) {
                // Issue 39 asks 1.1 of the exports; issue 27 asked 1.2 of every model.
                let busy_limit = if exported { 1.1 } else { 1.2 };
                // Two sets of ExecuTorch's own launches: the ratio a backend scores against
                // itself, next to each ratio of worst cases.
                let again = g.get("executorch cache, warm, busy cores, again");
                let itself = |of: fn(&Measured) -> f64| {
                    again.map_or(String::new(), |a| {
                        let ratio = of(a) / of(et);
                        format!(
                            " (ExecuTorch against itself: {:.3})",
                            ratio.max(1.0 / ratio)
                        )
                    })
                };
                verdict(
                    format!(
                        "{model} ({mode}): first execute beside busy cores, worst / ExecuTorch's worst{}",
                        itself(|m| m.first_execute_ms.max)
                    ),
                    xb.first_execute_ms.max / et.first_execute_ms.max,
                    busy_limit,
                );
                verdict(
                    format!(
                        "{model} ({mode}): steady execute beside busy cores, worst / ExecuTorch's worst{}",
                        itself(|m| m.steady_execute_ms.max)
                    ),
                    xb.steady_execute_ms.max / et.steady_execute_ms.max,
                    busy_limit,
                );
            }
        }
    }
    if !failures.is_empty() {
        md.push_str("\nNot measured (ExecuTorch's backend failed to launch):\n\n");
        for f in failures {
            let _ = writeln!(
                md,
                "- {} ({}), {}: {}",
                f.model, f.load_mode, f.scenario.name, f.reason
            );
        }
    }
    let _ = write!(
        md,
        "\nTargets:\n\n{verdicts}\nThe 1184-weight warm launch against XNNPACK's runtime-creation floor is measured by the load bench (`xnnblob-lab bench --dtype qd8 --mib 96 --scenarios xnnblob-warm,floor`).\n"
    );
    md
}

/// Short labels of the scenarios, in [`SCENARIOS`] order.
const SHORT: [&str; 10] = [
    "ET none",
    "ET cold",
    "ET warm",
    "xnnblob cold",
    "xnnblob warm",
    "ET disk*",
    "xnnblob disk*",
    "ET busy+",
    "xnnblob busy+",
    "ET busy+ again",
];

/// One panel per model and load mode: each scenario's load-to-ready (first output for the
/// from-disk scenarios), on a log scale, ExecuTorch in red and xnnblob in blue.
pub fn svg(path: &Path, results: &[PeerResult]) -> Result<(), String> {
    let models = models(results);
    let height = 40 + 260 * models.len().max(1) as u32;
    let root = SVGBackend::new(path, (1200, height)).into_drawing_area();
    let e = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let root = root
        .titled(
            "load-to-ready, ms (log); * = first output after a warm launch from a cold page cache; \
             + = worst first execute beside one busy thread per core",
            ("sans-serif", 16),
        )
        .map_err(|x| e(&x))?;
    let panels = root.split_evenly((models.len().max(1), LOAD_MODES.len()));
    for (i, panel) in panels.iter().enumerate() {
        let Some((model, mib)) = models.get(i / LOAD_MODES.len()) else {
            continue;
        };
        let mode = LOAD_MODES[i % LOAD_MODES.len()];
        let g = group(results, model, mode);
        let values: Vec<f64> = SCENARIOS
            .iter()
            .map(|s| {
                g.get(s.name).map_or(f64::NAN, |m| match s.cache {
                    CacheUse::WarmFromDisk => m.first_output_ms.median,
                    CacheUse::WarmBusy => m.first_execute_ms.max,
                    _ => m.load_to_ready_ms.median,
                })
            })
            .collect();
        let top = values
            .iter()
            .cloned()
            .filter(|v| v.is_finite())
            .fold(1.0, f64::max)
            * 3.0;
        let mut chart = ChartBuilder::on(panel)
            .margin(8)
            .x_label_area_size(24)
            .y_label_area_size(48)
            .caption(
                format!("{model} ({mib:.0} MiB), {mode}"),
                ("sans-serif", 13),
            )
            .build_cartesian_2d(
                (0..SCENARIOS.len() as i32).into_segmented(),
                (0.1f64..top).log_scale(),
            )
            .map_err(|x| e(&x))?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_label_style(("sans-serif", 10))
            .x_label_formatter(&|x| match x {
                SegmentValue::CenterOf(i) => SHORT.get(*i as usize).unwrap_or(&"").to_string(),
                _ => String::new(),
            })
            .draw()
            .map_err(|x| e(&x))?;
        chart
            .draw_series(
                values
                    .iter()
                    .enumerate()
                    .filter(|(_, v)| v.is_finite())
                    .map(|(i, v)| {
                        let color = if SCENARIOS[i].backend == "xnnblob" {
                            BLUE
                        } else {
                            RED
                        };
                        let i = i as i32;
                        Rectangle::new(
                            [
                                (SegmentValue::Exact(i), 0.1),
                                (SegmentValue::Exact(i + 1), v.max(0.1)),
                            ],
                            color.mix(0.6).filled(),
                        )
                    }),
            )
            .map_err(|x| e(&x))?;
        chart
            .draw_series(
                values
                    .iter()
                    .enumerate()
                    .filter(|(_, v)| v.is_finite())
                    .map(|(i, v)| {
                        Text::new(
                            if *v < 10.0 {
                                format!("{v:.1}")
                            } else {
                                format!("{v:.0}")
                            },
                            (SegmentValue::CenterOf(i as i32), v.max(0.1) * 1.15),
                            ("sans-serif", 10),
                        )
                    }),
            )
            .map_err(|x| e(&x))?;
    }
    root.present().map_err(|x| e(&x))
}
