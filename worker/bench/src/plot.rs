//! The PNG plots of the benchmarks (plotters, bitmap backend).

use std::path::Path;

use anyhow::{bail, Result};
use plotters::prelude::*;

use revault_engine::CachePolicy;

use crate::schemes::{KnobRow, MemoryRow, SchemeRow, StoreRow, PAPERS_CACHE};

pub fn register_font() -> Result<()> {
    let candidates = [
        "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
        "/usr/share/fonts/TTF/DejaVuSans.ttf",
    ];
    for c in candidates {
        if let Ok(bytes) = std::fs::read(c) {
            // plotters keeps fonts for the life of the process.
            let leaked: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            plotters::style::register_font("sans-serif", FontStyle::Normal, leaked)
                .map_err(|_| anyhow::anyhow!("{c} is not a usable font"))?;
            return Ok(());
        }
    }
    bail!("no font for the plots: install fonts-dejavu-core (hack/install-tools.sh does)")
}

const COLORS: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

pub fn lines_chart(
    path: &Path,
    caption: &str,
    xlabel: &str,
    ylabel: &str,
    series: &[(String, Vec<(f64, f64)>)],
) -> Result<()> {
    let root = BitMapBackend::new(path, (1100, 700)).into_drawing_area();
    root.fill(&WHITE)?;
    let xs = series.iter().flat_map(|s| s.1.iter().map(|p| p.0));
    let ys = series.iter().flat_map(|s| s.1.iter().map(|p| p.1));
    let (x0, x1) = xs.fold((f64::MAX, f64::MIN), |(a, b), x| (a.min(x), b.max(x)));
    let y1 = ys.fold(0f64, f64::max) * 1.1 + 1e-9;
    let mut chart = ChartBuilder::on(&root)
        .caption(caption, ("sans-serif", 24))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d(x0..x1.max(x0 + 1.0), 0f64..y1)?;
    chart
        .configure_mesh()
        .x_desc(xlabel)
        .y_desc(ylabel)
        .label_style(("sans-serif", 14))
        .draw()?;
    for (i, (name, pts)) in series.iter().enumerate() {
        draw_line(&mut chart, i, name, pts)?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .label_font(("sans-serif", 13))
        .position(SeriesLabelPosition::UpperRight)
        .draw()?;
    root.present()?;
    Ok(())
}

type Chart<'a, 'b> = ChartContext<
    'a,
    BitMapBackend<'b>,
    Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
>;

/// One line with its points marked, in the `i`-th colour, named in the legend.
fn draw_line(chart: &mut Chart<'_, '_>, i: usize, name: &str, pts: &[(f64, f64)]) -> Result<()> {
    let c = COLORS[i % COLORS.len()];
    chart
        .draw_series(LineSeries::new(pts.to_vec(), c.stroke_width(2)))?
        .label(name)
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
    chart.draw_series(pts.iter().map(|p| Circle::new(*p, 3, c.filled())))?;
    Ok(())
}

/// One panel per dedup unit, one line per rewrite policy (FAA restores).
pub fn plot_per_version(
    path: &Path,
    rows: &[SchemeRow],
    ylabel: &str,
    f: impl Fn(&SchemeRow) -> f64,
) -> Result<()> {
    let mut units: Vec<String> = rows.iter().map(|r| r.unit.clone()).collect();
    let mut seen = std::collections::HashSet::new();
    units.retain(|u| seen.insert(u.clone()));
    let mut policies: Vec<String> = rows.iter().map(|r| r.policy.clone()).collect();
    let mut seen = std::collections::HashSet::new();
    policies.retain(|p| seen.insert(p.clone()));
    let dflt: Vec<&SchemeRow> = rows
        .iter()
        .filter(|r| r.cache == PAPERS_CACHE.name())
        .collect();
    let y1 = dflt.iter().map(|r| f(r)).fold(0f64, f64::max) * 1.15 + 1e-9;
    let x1 = dflt
        .iter()
        .map(|r| f64::from(r.version))
        .fold(1f64, f64::max);
    let root = BitMapBackend::new(path, (560 * units.len().max(1) as u32, 520)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(&format!("{ylabel} per version"), ("sans-serif", 24))?;
    for (panel, unit) in root
        .split_evenly((1, units.len().max(1)))
        .iter()
        .zip(&units)
    {
        let mut chart = ChartBuilder::on(panel)
            .caption(format!("unit: {unit}"), ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(50)
            .build_cartesian_2d(1f64..x1.max(2.0), 0f64..y1)?;
        chart
            .configure_mesh()
            .x_desc("version")
            .y_desc(ylabel)
            .label_style(("sans-serif", 13))
            .draw()?;
        for (i, p) in policies.iter().enumerate() {
            let pts: Vec<(f64, f64)> = dflt
                .iter()
                .filter(|r| &r.unit == unit && &r.policy == p)
                .map(|r| (f64::from(r.version), f(r)))
                .collect();
            draw_line(&mut chart, i, p, &pts)?;
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .label_font(("sans-serif", 12))
            .position(SeriesLabelPosition::LowerLeft)
            .draw()?;
    }
    root.present()?;
    Ok(())
}

pub fn plot_tradeoff(path: &Path, knobs: &[KnobRow], stores: &[StoreRow]) -> Result<()> {
    let mut names: Vec<String> = knobs
        .iter()
        .map(|k| format!("{}/{}", k.unit, k.policy))
        .collect();
    names.sort();
    names.dedup();
    let mut series: Vec<(String, Vec<(f64, f64)>)> = names
        .into_iter()
        .map(|n| {
            let mut pts: Vec<(f64, f64)> = knobs
                .iter()
                .filter(|k| format!("{}/{}", k.unit, k.policy) == n)
                .map(|k| (k.dedup_ratio, k.latest_speed_factor))
                .collect();
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            (n, pts)
        })
        .collect();
    for s in stores.iter().filter(|s| s.scheme.ends_with("/none")) {
        series.push((
            s.scheme.clone(),
            vec![(s.dedup_ratio, s.latest_speed_factor)],
        ));
    }
    if series.is_empty() {
        return Ok(());
    }
    lines_chart(
        path,
        "dedup ratio against speed factor of the latest version",
        "dedup ratio",
        "speed factor",
        &series,
    )
}

pub fn plot_memory(path: &Path, memory: &[MemoryRow]) -> Result<()> {
    let series: Vec<(String, Vec<(f64, f64)>)> = CachePolicy::ALL
        .iter()
        .map(|c| {
            let pts = memory
                .iter()
                .filter(|m| m.cache == c.name())
                .map(|m| (m.memory_mib as f64, m.container_reads as f64))
                .collect();
            (c.name().to_string(), pts)
        })
        .filter(|(_, p): &(String, Vec<(f64, f64)>)| !p.is_empty())
        .collect();
    if series.is_empty() {
        return Ok(());
    }
    lines_chart(
        path,
        "container reads of the latest version against restore memory",
        "restore memory (MiB)",
        "container reads",
        &series,
    )
}
