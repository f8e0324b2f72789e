//! `revault retention show|set`: a series' retention rules (docs/retention.md), the
//! calendar counts among them.

use anyhow::{Context, Result};
use revault_engine::OpenMode;

use crate::cli::{open, RetentionCmd};
use crate::output;

pub fn run(c: RetentionCmd, json: bool) -> Result<()> {
    match c {
        RetentionCmd::Show(a) => {
            let store = open(&a.store, OpenMode::ReadOnly, "revault retention show")?;
            let s = store.series(&a.series)?;
            if json {
                output::json(&s.retention);
            } else {
                print_retention(&s.name, &s.retention);
            }
        }
        RetentionCmd::Set(a) => {
            let keep_within_secs = a
                .keep_within
                .as_deref()
                .map(|d| {
                    humantime::parse_duration(d).with_context(|| {
                        format!("--keep-within {d:?}: expected a duration like 30d or 12h")
                    })
                })
                .transpose()?
                .map(|d| d.as_secs());
            let store = open(
                &a.series.store,
                OpenMode::ReadWrite,
                "revault retention set",
            )?;
            let r = revault_engine::Retention {
                keep: a.keep,
                keep_within_secs,
                calendar: revault_engine::Calendar {
                    hourly: a.keep_hourly,
                    daily: a.keep_daily,
                    weekly: a.keep_weekly,
                    monthly: a.keep_monthly,
                    yearly: a.keep_yearly,
                    timezone: a.timezone,
                },
                live: a.live,
                auto: revault_engine::auto_or_current(&store, &a.series.series, a.auto)?,
            };
            let (s, _) = revault_engine::set_retention(&store, &a.series.series, r)?;
            store.durable(|| format!("the retention of {}", a.series.series))?;
            if json {
                output::json(&s.retention);
            } else {
                print_retention(&s.name, &s.retention);
            }
        }
    }
    Ok(())
}

fn print_retention(name: &str, r: &revault_engine::Retention) {
    let c = &r.calendar;
    let calendar: Vec<String> = c
        .counts()
        .iter()
        .filter_map(|(period, n)| n.map(|n| format!("{period} {n}")))
        .collect();
    let calendar = if calendar.is_empty() {
        "-".to_string()
    } else {
        format!(
            "{} ({})",
            calendar.join(", "),
            c.timezone.as_deref().unwrap_or("UTC")
        )
    };
    println!(
        "{name}: keep {}, keep within {}, calendar {calendar}, live window {}, automatic {}",
        r.keep.map(|k| k.to_string()).unwrap_or_else(|| {
            if r.keep_within_secs.is_some() || !c.is_empty() {
                "-".into()
            } else {
                "all".into()
            }
        }),
        r.keep_within_secs
            .map(|s| humantime::format_duration(std::time::Duration::from_secs(s)).to_string())
            .unwrap_or_else(|| "-".into()),
        r.live,
        if r.auto { "yes" } else { "no" }
    );
}
