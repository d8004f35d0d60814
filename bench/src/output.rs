//! Writing a run's results: report.json (every sample), table.md, and the SVG plots.

use anyhow::{Context, Result};
use kvroute_bench::plot;
use kvroute_bench::report::{markdown, RunReport};
use std::path::Path;

/// Returns the paths written, for the final message.
pub fn write(report: &RunReport, dir: &Path) -> Result<Vec<String>> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut written = Vec::new();
    let mut put = |name: &str, text: String| -> Result<()> {
        let p = dir.join(name);
        std::fs::write(&p, text).with_context(|| format!("writing {}", p.display()))?;
        written.push(p.display().to_string());
        Ok(())
    };
    put("report.json", serde_json::to_string_pretty(report)?)?;
    put("table.md", markdown(report))?;
    let title = format!("TTFT CDF — {} workload", report.workload);
    put("ttft_cdf.svg", plot::ttft_cdf_svg(report, &title))?;
    let rates: std::collections::BTreeSet<u64> =
        report.passes.iter().filter_map(|p| p.rate).map(|r| (r * 1000.0) as u64).collect();
    if rates.len() > 1 {
        let title = format!("Goodput vs rate — {} (TTFT <= {} s)", report.workload, report.slo.ttft_s);
        put("goodput.svg", plot::goodput_svg(report, &title))?;
    }
    Ok(written)
}
