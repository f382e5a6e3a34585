//! Python's `datetime.strftime` in the C locale, for templates'
//! `strftime_now`: a civil time from the Unix clock and glibc's directives.

/// A moment in civil time, the fields `strftime` reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CivilTime {
    pub year: i64,
    /// 1..=12
    pub month: u32,
    /// 1..=31
    pub day: u32,
    pub hour: u32,
    pub minute: u32,
    pub second: u32,
    pub microsecond: u32,
}

impl CivilTime {
    /// UTC civil time of a Unix timestamp (seconds and microseconds).
    pub fn from_unix(secs: i64, micros: u32) -> CivilTime {
        let days = secs.div_euclid(86_400);
        let rem = secs.rem_euclid(86_400) as u32;
        // Howard Hinnant's days-to-civil algorithm.
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z.rem_euclid(146_097);
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
        let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
        let year = yoe + era * 400 + i64::from(month <= 2);
        CivilTime {
            year,
            month,
            day,
            hour: rem / 3600,
            minute: rem / 60 % 60,
            second: rem % 60,
            microsecond: micros,
        }
    }

    /// The current time in UTC.
    pub fn now_utc() -> CivilTime {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        CivilTime::from_unix(now.as_secs() as i64, now.subsec_micros())
    }

    fn is_leap(&self) -> bool {
        (self.year % 4 == 0 && self.year % 100 != 0) || self.year % 400 == 0
    }

    /// Day of the year, 1..=366.
    fn yday(&self) -> u32 {
        const BEFORE: [u32; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
        BEFORE[(self.month - 1) as usize] + self.day + u32::from(self.month > 2 && self.is_leap())
    }

    /// Day of the week, 0 = Sunday (C's `tm_wday`).
    fn wday(&self) -> u32 {
        // Zeller-like: 1970-01-01 was a Thursday.
        let (y, m) = if self.month <= 2 {
            (self.year - 1, self.month + 12)
        } else {
            (self.year, self.month)
        };
        let k = y.rem_euclid(100);
        let j = y.div_euclid(100);
        let h = (i64::from(self.day) + (13 * (i64::from(m) + 1)) / 5 + k + k / 4 + j / 4 + 5 * j)
            .rem_euclid(7);
        // h: 0 = Saturday
        ((h + 6) % 7) as u32
    }
}

const DAYS: [&str; 7] = [
    "Sunday",
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
];
const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

/// `datetime.strftime(format)` in the C locale for a UTC time, with glibc's
/// `-` (no padding) flag. Unknown directives are kept as written, as glibc
/// does.
pub fn strftime(t: &CivilTime, format: &str) -> String {
    let mut out = String::new();
    let mut chars = format.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let no_pad = chars.peek() == Some(&'-');
        if no_pad {
            chars.next();
        }
        let Some(d) = chars.next() else {
            out.push('%');
            if no_pad {
                out.push('-');
            }
            break;
        };
        let num = |n: u32, width: usize, pad: char| -> String {
            if no_pad {
                n.to_string()
            } else if pad == ' ' {
                format!("{n:>width$}")
            } else {
                format!("{n:0width$}")
            }
        };
        let hour12 = if t.hour.is_multiple_of(12) {
            12
        } else {
            t.hour % 12
        };
        let wday = t.wday();
        let piece = match d {
            'a' => DAYS[wday as usize][..3].to_owned(),
            'A' => DAYS[wday as usize].to_owned(),
            'b' | 'h' => MONTHS[(t.month - 1) as usize][..3].to_owned(),
            'B' => MONTHS[(t.month - 1) as usize].to_owned(),
            'c' => format!(
                "{} {} {:>2} {:02}:{:02}:{:02} {}",
                &DAYS[wday as usize][..3],
                &MONTHS[(t.month - 1) as usize][..3],
                t.day,
                t.hour,
                t.minute,
                t.second,
                t.year
            ),
            'C' => num((t.year / 100) as u32, 2, '0'),
            'd' => num(t.day, 2, '0'),
            'D' | 'x' => format!("{:02}/{:02}/{:02}", t.month, t.day, t.year.rem_euclid(100)),
            'e' => num(t.day, 2, ' '),
            'f' => format!("{:06}", t.microsecond),
            'F' => format!("{}-{:02}-{:02}", t.year, t.month, t.day),
            'H' => num(t.hour, 2, '0'),
            'I' => num(hour12, 2, '0'),
            'j' => num(t.yday(), 3, '0'),
            'k' => num(t.hour, 2, ' '),
            'l' => num(hour12, 2, ' '),
            'm' => num(t.month, 2, '0'),
            'M' => num(t.minute, 2, '0'),
            'n' => "\n".to_owned(),
            'p' => if t.hour < 12 { "AM" } else { "PM" }.to_owned(),
            'R' => format!("{:02}:{:02}", t.hour, t.minute),
            'S' => num(t.second, 2, '0'),
            't' => "\t".to_owned(),
            'T' | 'X' => format!("{:02}:{:02}:{:02}", t.hour, t.minute, t.second),
            'u' => (if wday == 0 { 7 } else { wday }).to_string(),
            'w' => wday.to_string(),
            'U' => num((t.yday() + 6 - wday) / 7, 2, '0'),
            'W' => num((t.yday() + 6 - (wday + 6) % 7) / 7, 2, '0'),
            'y' => num(t.year.rem_euclid(100) as u32, 2, '0'),
            'Y' => t.year.to_string(),
            'z' => "+0000".to_owned(),
            'Z' => "UTC".to_owned(),
            '%' => "%".to_owned(),
            other => {
                let mut kept = String::from('%');
                if no_pad {
                    kept.push('-');
                }
                kept.push(other);
                kept
            }
        };
        out.push_str(&piece);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strftime_matches_python_in_c_locale() {
        // 2024-02-29 07:05:09.012345 UTC, a Thursday.
        let t = CivilTime::from_unix(1_709_190_309, 12_345);
        assert_eq!(
            t,
            CivilTime {
                year: 2024,
                month: 2,
                day: 29,
                hour: 7,
                minute: 5,
                second: 9,
                microsecond: 12_345
            }
        );
        // Expected strings from Python's datetime(2024, 2, 29, 7, 5, 9, 12345).strftime(...).
        assert_eq!(strftime(&t, "%d %b %Y"), "29 Feb 2024");
        assert_eq!(
            strftime(&t, "%A, %B %-d, %Y"),
            "Thursday, February 29, 2024"
        );
        assert_eq!(
            strftime(&t, "%Y-%m-%d %H:%M:%S.%f"),
            "2024-02-29 07:05:09.012345"
        );
        assert_eq!(
            strftime(&t, "%I %p %j %a %y %e %w %u"),
            "07 AM 060 Thu 24 29 4 4"
        );
        assert_eq!(
            strftime(&t, "%U %W %c %%"),
            "08 09 Thu Feb 29 07:05:09 2024 %"
        );
    }
}
