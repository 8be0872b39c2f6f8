//! The Trace object: clock, pointer size, process and sampling facts for the whole trace.

use super::bytes::{Bytes, Result};
use super::stream::Block;

/// Facts about the whole trace, from its Trace object.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TraceInfo {
    /// Format version: 4 and 5 (FastSerialization framing) or 6.
    pub format_version: u32,
    /// Wall-clock time of `sync_time_qpc`, as `[year, month, day_of_week, day, hour, minute,
    /// second, millisecond]` in UTC.
    pub sync_time_utc: [u16; 8],
    /// Timestamp (ticks) taken at `sync_time_utc`.
    pub sync_time_qpc: u64,
    /// Ticks per second of event timestamps.
    pub qpc_frequency: u64,
    /// Pointer size of the traced process in bytes (4 or 8); stack IPs use this size.
    pub pointer_size: u8,
    /// The traced process id (0 when unknown).
    pub process_id: u32,
    /// Logical processors of the machine.
    pub processor_count: u32,
    /// The runtime's CPU sampling period in nanoseconds (0 when not given).
    pub sampling_period_ns: u32,
    /// Free-form key/value pairs (format V6).
    pub key_values: Vec<(String, String)>,
}

impl TraceInfo {
    /// The sync time as nanoseconds since the Unix epoch, if the date is plausible.
    pub fn sync_time_unix_ns(&self) -> Option<u64> {
        let [year, month, _, day, hour, minute, second, ms] = self.sync_time_utc;
        if !(1970..=9999).contains(&year) || !(1..=12).contains(&month) || !(1..=31).contains(&day)
        {
            return None;
        }
        let days = days_from_civil(i64::from(year), i64::from(month), i64::from(day));
        let secs =
            days * 86_400 + i64::from(hour) * 3600 + i64::from(minute) * 60 + i64::from(second);
        u64::try_from(secs)
            .ok()?
            .checked_mul(1_000_000_000)?
            .checked_add(u64::from(ms) * 1_000_000)
    }

    /// Converts an event timestamp (ticks) to nanoseconds since the Unix epoch (or, when the sync
    /// date is unusable, to nanoseconds since `sync_time_qpc`). Saturates instead of overflowing.
    pub fn timestamp_ns(&self, ticks: u64) -> u64 {
        let base = i128::from(self.sync_time_unix_ns().unwrap_or(0));
        let freq = i128::from(self.qpc_frequency.max(1));
        let delta = i128::from(ticks) - i128::from(self.sync_time_qpc);
        let ns = base + delta * 1_000_000_000 / freq;
        ns.clamp(0, i128::from(u64::MAX)) as u64
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

pub(crate) fn parse_trace(block: &Block, format_version: u32) -> Result<TraceInfo> {
    let mut b = Bytes::new(&block.data, block.base);
    let mut info = TraceInfo {
        format_version,
        ..TraceInfo::default()
    };
    for v in &mut info.sync_time_utc {
        *v = b.u16("trace sync time")?;
    }
    info.sync_time_qpc = b.u64("trace sync timestamp")?;
    info.qpc_frequency = b.u64("trace timestamp frequency")?;
    let pointer_size = b.u32("trace pointer size")?;
    if pointer_size != 4 && pointer_size != 8 {
        return Err(b.malformed(format!("pointer size {pointer_size} (expected 4 or 8)")));
    }
    info.pointer_size = pointer_size as u8;
    if format_version >= 6 {
        let count = b.u32("trace key/value count")?;
        for _ in 0..count {
            let k = b.utf8_varlen("trace key")?;
            let v = b.utf8_varlen("trace value")?;
            let number = v.parse::<u32>().ok();
            match k.as_str() {
                "ProcessId" => info.process_id = number.unwrap_or(0),
                "HardwareThreadCount" => info.processor_count = number.unwrap_or(0),
                "ExpectedCPUSamplingRate" => info.sampling_period_ns = number.unwrap_or(0),
                _ => {}
            }
            info.key_values.push((k, v));
        }
    } else {
        info.process_id = b.u32("trace process id")?;
        info.processor_count = b.u32("trace processor count")?;
        info.sampling_period_ns = b.u32("trace sampling rate")?;
    }
    Ok(info)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sync_time_converts_to_unix() {
        let info = TraceInfo {
            sync_time_utc: [2021, 6, 3, 9, 9, 48, 25, 902],
            sync_time_qpc: 1000,
            qpc_frequency: 10_000_000,
            ..TraceInfo::default()
        };
        // 2021-06-09T09:48:25.902Z
        assert_eq!(info.sync_time_unix_ns(), Some(1_623_232_105_902_000_000));
        assert_eq!(info.timestamp_ns(1010), 1_623_232_105_902_001_000);
        assert_eq!(info.timestamp_ns(0), 1_623_232_105_901_900_000);
    }
}
