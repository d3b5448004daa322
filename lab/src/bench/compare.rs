//! `xnnblob-lab bench compare BASE.json NEW.json --max-regression PCT`: the change of every
//! scenario two bench runs share, for people who keep load time in check (in CI, say).
//!
//! Reads the JSON the peer bench writes (`peer.json`: `results`, each with `model`,
//! `load_mode`, `scenario` and medians) and the prefill bench's (`prefill.json`: `gated`, each a
//! `name` and a `value`, times and instruction counts, lower being better). A scenario regresses
//! when a timed median or a gated value grew by more than the threshold; memory is reported, not
//! gated.

use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;

/// The medians one scenario measured.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Medians {
    load_to_ready_ms: f64,
    first_execute_ms: Option<f64>,
    peak_rss_mib: Option<f64>,
}

/// Scenario name (model, load mode, scenario) → its medians.
type Results = BTreeMap<String, Medians>;

/// A figure's name → its value (lower is better).
type Gated = BTreeMap<String, f64>;

fn read(path: &Path) -> Result<(Results, Gated), String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let json: Value =
        serde_json::from_str(&text).map_err(|e| format!("{}: not JSON: {e}", path.display()))?;
    let mut gated = Gated::new();
    if let Some(figures) = json["gated"].as_array() {
        for (i, g) in figures.iter().enumerate() {
            match (g["name"].as_str(), g["value"].as_f64()) {
                (Some(name), Some(value)) => gated.insert(name.to_string(), value),
                _ => {
                    return Err(format!(
                        "{}: gated figure {i} has no name or value",
                        path.display()
                    ));
                }
            };
        }
    }
    let results = match json["results"].as_array() {
        Some(results) => results,
        None if json["gated"].is_array() => return Ok((Results::new(), gated)),
        None => {
            return Err(format!(
                "{}: no \"results\" or \"gated\" list",
                path.display()
            ));
        }
    };
    let mut out = Results::new();
    for (i, r) in results.iter().enumerate() {
        let text = |key: &str| r[key].as_str().unwrap_or("?").to_string();
        let name = format!(
            "{} | {} | {}",
            text("model"),
            text("load_mode"),
            text("scenario")
        );
        let load = r["load_to_ready_ms"]["median"].as_f64().ok_or_else(|| {
            format!(
                "{}: result {i} has no load_to_ready_ms.median",
                path.display()
            )
        })?;
        out.insert(
            name,
            Medians {
                load_to_ready_ms: load,
                first_execute_ms: r["first_execute_ms"]["median"].as_f64(),
                peak_rss_mib: r["peak_rss_mib"].as_f64(),
            },
        );
    }
    Ok((out, gated))
}

fn change(base: f64, new: f64) -> f64 {
    if base > 0.0 {
        (new - base) / base * 100.0
    } else {
        0.0
    }
}

/// Compares two result files; returns the report and whether any scenario regressed beyond
/// `max_regression_pct`.
pub fn compare(base: &Path, new: &Path, max_regression_pct: f64) -> Result<(String, bool), String> {
    let ((before, before_gated), (after, after_gated)) = (read(base)?, read(new)?);
    let mut report = String::from(
        "| scenario | load-to-ready ms | change | first execute ms | change | peak RSS MiB |\n|---|---|---|---|---|---|\n",
    );
    let mut regressed = Vec::new();
    let mut shared = 0;
    for (name, b) in &before {
        let Some(a) = after.get(name) else {
            continue;
        };
        shared += 1;
        let load_change = change(b.load_to_ready_ms, a.load_to_ready_ms);
        let exec = match (b.first_execute_ms, a.first_execute_ms) {
            (Some(x), Some(y)) => Some((x, y, change(x, y))),
            _ => None,
        };
        let mut flags = Vec::new();
        if load_change > max_regression_pct {
            flags.push("load-to-ready");
        }
        if exec.is_some_and(|(_, _, c)| c > max_regression_pct) {
            flags.push("first execute");
        }
        let exec_cells = exec.map_or("- | -".to_string(), |(x, y, c)| {
            format!("{x:.2} -> {y:.2} | {c:+.1}%")
        });
        let rss = match (b.peak_rss_mib, a.peak_rss_mib) {
            (Some(x), Some(y)) => format!("{x:.0} -> {y:.0}"),
            _ => "-".into(),
        };
        report.push_str(&format!(
            "| {name} | {:.2} -> {:.2} | {load_change:+.1}% | {exec_cells} | {rss} |\n",
            b.load_to_ready_ms, a.load_to_ready_ms
        ));
        if !flags.is_empty() {
            regressed.push(format!("{name} ({})", flags.join(", ")));
        }
    }
    let mut gated_rows = String::new();
    for (name, &b) in &before_gated {
        let Some(&a) = after_gated.get(name) else {
            continue;
        };
        shared += 1;
        let c = change(b, a);
        gated_rows.push_str(&format!("| {name} | {b:.4} -> {a:.4} | {c:+.1}% |\n"));
        if c > max_regression_pct {
            regressed.push(name.clone());
        }
    }
    if !gated_rows.is_empty() {
        report.push_str("\n| figure | value | change |\n|---|---|---|\n");
        report.push_str(&gated_rows);
    }
    if shared == 0 {
        return Err("the two files share no scenario".into());
    }
    if regressed.is_empty() {
        report.push_str(&format!(
            "\nno scenario regressed by more than {max_regression_pct}%\n"
        ));
    } else {
        report.push_str(&format!(
            "\nregressed by more than {max_regression_pct}%:\n"
        ));
        for r in &regressed {
            report.push_str(&format!("- {r}\n"));
        }
    }
    Ok((report, !regressed.is_empty()))
}

#[cfg(test)]
mod tests {
    use super::compare;

    fn results(load: f64, exec: f64) -> String {
        serde_json::json!({"repeats": 5, "results": [
            {"model": "m", "load_mode": "mmap", "scenario": "xnnblob, warm",
             "load_to_ready_ms": {"median": load, "min": load, "max": load},
             "first_execute_ms": {"median": exec, "min": exec, "max": exec},
             "peak_rss_mib": 100.0},
            {"model": "m", "load_mode": "file", "scenario": "only in one",
             "load_to_ready_ms": {"median": 1.0}}
        ]})
        .to_string()
    }

    #[test]
    fn a_slower_scenario_beyond_the_threshold_is_a_regression() {
        let dir = tempfile::tempdir().unwrap();
        let (base, new) = (dir.path().join("base.json"), dir.path().join("new.json"));
        std::fs::write(&base, results(10.0, 20.0)).unwrap();
        std::fs::write(&new, results(11.5, 20.0)).unwrap();
        let (report, regressed) = compare(&base, &new, 10.0).unwrap();
        assert!(regressed, "{report}");
        assert!(report.contains("+15.0%"), "{report}");
        let (_, regressed) = compare(&base, &new, 20.0).unwrap();
        assert!(!regressed);
        // Faster is never a regression, and first execute counts too.
        std::fs::write(&new, results(5.0, 30.0)).unwrap();
        let (report, regressed) = compare(&base, &new, 10.0).unwrap();
        assert!(regressed && report.contains("first execute"), "{report}");
    }

    fn gated(execute_ms: f64, instructions: f64) -> String {
        serde_json::json!({"bench": "prefill", "gated": [
            {"name": "prefill t16 | execute ms | xnnblob", "value": execute_ms},
            {"name": "prefill t16 | max execute instructions | xnnblob", "value": instructions},
        ]})
        .to_string()
    }

    #[test]
    fn a_gated_figure_that_grew_beyond_the_threshold_is_a_regression() {
        let dir = tempfile::tempdir().unwrap();
        let (base, new) = (dir.path().join("base.json"), dir.path().join("new.json"));
        std::fs::write(&base, gated(10.0, 5e7)).unwrap();
        std::fs::write(&new, gated(10.5, 5.6e7)).unwrap();
        let (report, regressed) = compare(&base, &new, 10.0).unwrap();
        assert!(regressed, "{report}");
        assert!(report.contains("instructions | xnnblob\n"), "{report}");
        assert!(report.contains("+12.0%"), "{report}");
        std::fs::write(&new, gated(9.0, 5e7)).unwrap();
        let (report, regressed) = compare(&base, &new, 10.0).unwrap();
        assert!(!regressed, "{report}");
        std::fs::write(&new, "{\"gated\": [{\"name\": \"x\"}]}").unwrap();
        assert!(
            compare(&base, &new, 10.0)
                .unwrap_err()
                .contains("no name or value")
        );
    }

    #[test]
    fn unreadable_or_unrelated_files_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let (base, new) = (dir.path().join("base.json"), dir.path().join("new.json"));
        std::fs::write(&base, results(10.0, 20.0)).unwrap();
        std::fs::write(&new, "{\"results\": []}").unwrap();
        assert!(
            compare(&base, &new, 10.0)
                .unwrap_err()
                .contains("share no scenario")
        );
        std::fs::write(&new, "not json").unwrap();
        assert!(compare(&base, &new, 10.0).unwrap_err().contains("not JSON"));
        assert!(compare(&base, &dir.path().join("missing.json"), 10.0).is_err());
    }
}
