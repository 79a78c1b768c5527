//! What chat templates see of Python: transformers renders templates with Jinja2, so values
//! print as Python's `str()` does, `tojson` is Python's `json.dumps` and `strftime_now` is
//! `datetime.now().strftime` (local time). This module gives minijinja those behaviours:
//! - [`py_float_repr`]: Python's `repr(float)` (shortest round-trip digits, exponent form when
//!   the decimal point is at or before the 4th place after the point or past the 16th digit,
//!   `e+NN`/`e-NN` with two digits at least: `1e+20`, `1e-07`, `0.0001`, `1.0`);
//! - [`py_format`]: the output formatter (`{{ x }}` prints `True`, `None`, `[1, 'a']`,
//!   `{'k': 1.5}` as Python does);
//! - [`tojson`]: transformers' `tojson(x, ensure_ascii=False, indent=None, separators=None,
//!   sort_keys=False)` filter (positional arguments in that order, as its Python signature);
//! - [`strftime_now`] and [`format_time`]: C `strftime` codes over the local time.

use minijinja::value::{Kwargs, ValueKind as K};
use minijinja::{Error, ErrorKind, Output, State, Value};

/// Python's `repr(x)` (= `str(x)`) of a float: `1e+20`, `1e-07`, `0.1`, `100.0`, `nan`, `inf`.
/// Digits: Rust's shortest round-trip formatting (the same digits as Python's `repr`, David
/// Gay's shortest mode); layout: CPython `float_repr_style` `'r'` (`Py_DTSF_ADD_DOT_0`).
pub fn py_float_repr(f: f64) -> String {
    if f.is_nan() {
        return "nan".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "inf" } else { "-inf" }.into();
    }
    let e = format!("{f:e}");
    let (mant, exp) = e.split_once('e').expect("{:e} has an exponent");
    let exp: i32 = exp.parse().expect("integer exponent");
    let (sign, mant) = match mant.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mant),
    };
    let digits: String = mant.chars().filter(|c| *c != '.').collect();
    let n = digits.len() as i32;
    let decpt = exp + 1;
    let body = if decpt > -4 && decpt <= 16 {
        if decpt <= 0 {
            format!("0.{}{digits}", "0".repeat((-decpt) as usize))
        } else if decpt >= n {
            format!("{digits}{}.0", "0".repeat((decpt - n) as usize))
        } else {
            format!(
                "{}.{}",
                &digits[..decpt as usize],
                &digits[decpt as usize..]
            )
        }
    } else {
        let rest = if n > 1 {
            format!(".{}", &digits[1..])
        } else {
            String::new()
        };
        let es = if exp < 0 { '-' } else { '+' };
        format!("{}{rest}e{es}{:02}", &digits[..1], exp.abs())
    };
    format!("{sign}{body}")
}

/// Python's `repr()` of a string: single quotes unless the text holds `'` and no `"`;
/// backslash, the quote, `\n`, `\r`, `\t` escaped, other control characters as `\xNN`.
pub fn py_str_repr(s: &str) -> String {
    let q = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(q);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == q => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push(q);
    out
}

/// Python's `str()` of a template value (`repr` = false) or its `repr()` (inside containers):
/// `None`, `True`/`False`, Python float text, lists as `[a, b]`, mappings as `{k: v}`.
/// Undefined prints nothing, as Jinja2's default `Undefined` (`Undefined` inside containers).
pub fn py_text(v: &Value, repr: bool) -> Result<String, Error> {
    Ok(match v.kind() {
        K::Undefined if repr => "Undefined".into(),
        K::Undefined => String::new(),
        K::None => "None".into(),
        K::Bool => if v.is_true() { "True" } else { "False" }.into(),
        K::Number if !v.is_integer() => py_float_repr(f64::try_from(v.clone())?),
        K::String if repr => py_str_repr(v.as_str().unwrap_or_default()),
        K::Seq => {
            let items: Result<Vec<String>, Error> =
                v.try_iter()?.map(|x| py_text(&x, true)).collect();
            let items = items?;
            if v.is_tuple() {
                match items.len() {
                    1 => format!("({},)", items[0]),
                    _ => format!("({})", items.join(", ")),
                }
            } else {
                format!("[{}]", items.join(", "))
            }
        }
        K::Map if v.as_object().is_some() => {
            let mut parts = Vec::new();
            for k in v.try_iter()? {
                let item = v.get_item(&k)?;
                parts.push(format!("{}: {}", py_text(&k, true)?, py_text(&item, true)?));
            }
            format!("{{{}}}", parts.join(", "))
        }
        _ => v.to_string(),
    })
}

/// The output formatter: `{{ x }}` writes Python's `str(x)` ([`py_text`]).
pub fn py_format(out: &mut Output, _state: &mut State, v: &Value) -> Result<(), Error> {
    let text = py_text(v, false)?;
    out.write_str(&text)
        .map_err(|e| Error::new(ErrorKind::WriteFailure, e.to_string()))
}

/// transformers' `tojson` filter: `json.dumps(x, ensure_ascii=False, indent=None,
/// separators=None, sort_keys=False)`, arguments positional in that order or by name.
/// `indent` is a number of spaces (0 and below: newlines without indentation) or a string;
/// `separators` a pair `(item, key)` (default `", "`/`": "`, and `","` between items when
/// indented); `ensure_ascii` writes every non-ASCII character as `\uXXXX` (UTF-16 pairs above
/// U+FFFF). Floats print as Python's `repr`; NaN and infinities as `NaN`, `Infinity`,
/// `-Infinity`. The result is marked safe (never HTML-escaped).
///
/// Errors: unknown keyword arguments, a value JSON cannot hold (an undefined value, as Python's
/// `Undefined`; a mapping key that is not a string, number, boolean or none; a function), more
/// than four positional arguments.
pub fn tojson(value: &Value, args: &[Value], kwargs: Kwargs) -> Result<Value, Error> {
    const NAMES: [&str; 4] = ["ensure_ascii", "indent", "separators", "sort_keys"];
    if args.len() > NAMES.len() {
        return Err(Error::new(
            ErrorKind::TooManyArguments,
            "tojson takes at most 4 positional arguments",
        ));
    }
    let mut opt: [Value; 4] = Default::default();
    for (i, a) in args.iter().enumerate() {
        opt[i] = a.clone();
    }
    for (i, name) in NAMES.iter().enumerate() {
        if let Some(v) = kwargs.get::<Option<Value>>(name)? {
            opt[i] = v;
        }
    }
    kwargs.assert_all_used()?;
    let [ensure_ascii, indent, separators, sort_keys] = opt;
    let indent = match indent.kind() {
        K::Undefined | K::None => None,
        K::String => Some(indent.as_str().unwrap_or_default().to_string()),
        K::Number => Some(" ".repeat(i64::try_from(indent.clone())?.max(0) as usize)),
        _ => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!(
                    "tojson: indent must be a number or a string, not {}",
                    indent.kind()
                ),
            ))
        }
    };
    let (item_sep, key_sep) = match separators.kind() {
        K::Undefined | K::None => (
            if indent.is_some() { "," } else { ", " }.to_string(),
            ": ".to_string(),
        ),
        _ => {
            let parts: Vec<Value> = separators.try_iter()?.collect();
            match parts.as_slice() {
                [a, b] => (text_of(a)?, text_of(b)?),
                _ => {
                    return Err(Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson: separators must be a pair (item_separator, key_separator)",
                    ))
                }
            }
        }
    };
    let w = JsonWriter {
        ascii: ensure_ascii.is_true(),
        indent,
        item_sep,
        key_sep,
        sort_keys: sort_keys.is_true(),
    };
    let mut out = String::new();
    w.value(value, 0, &mut out)?;
    Ok(Value::from_safe_string(out))
}

fn text_of(v: &Value) -> Result<String, Error> {
    v.as_str().map(str::to_string).ok_or_else(|| {
        Error::new(
            ErrorKind::InvalidOperation,
            format!("tojson: a separator must be a string, not {}", v.kind()),
        )
    })
}

/// `json.dumps`'s settings.
struct JsonWriter {
    ascii: bool,
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
}

impl JsonWriter {
    fn newline(&self, depth: usize, out: &mut String) {
        if let Some(ind) = &self.indent {
            out.push('\n');
            for _ in 0..depth {
                out.push_str(ind);
            }
        }
    }

    fn string(&self, s: &str, out: &mut String) {
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{8}' => out.push_str("\\b"),
                '\u{c}' => out.push_str("\\f"),
                // The mark that keeps message text literal (`literal.rs`) is removed before
                // tokenization, so it must stay one character: escaping it would leave
                // `\ufdd0` in the prompt. (A U+FDD0 the user wrote is U+FFFD by then.)
                super::literal::MARK => out.push(c),
                c if (c as u32) < 0x20 || (self.ascii && c as u32 > 0x7e) => {
                    let mut buf = [0u16; 2];
                    for unit in c.encode_utf16(&mut buf) {
                        out.push_str(&format!("\\u{unit:04x}"));
                    }
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }

    /// A mapping key as `json.dumps` converts it (strings as they are; numbers, booleans and
    /// none to their JSON text).
    fn key(&self, k: &Value) -> Result<String, Error> {
        Ok(match k.kind() {
            K::String => k.as_str().unwrap_or_default().to_string(),
            K::Bool => if k.is_true() { "true" } else { "false" }.into(),
            K::None => "null".into(),
            K::Number if k.is_integer() => k.to_string(),
            K::Number => json_float(f64::try_from(k.clone())?),
            other => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("tojson: keys must be str, int, float, bool or None, not {other}"),
                ))
            }
        })
    }

    fn value(&self, v: &Value, depth: usize, out: &mut String) -> Result<(), Error> {
        match v.kind() {
            K::None => out.push_str("null"),
            K::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
            K::Number if v.is_integer() => out.push_str(&v.to_string()),
            K::Number => out.push_str(&json_float(f64::try_from(v.clone())?)),
            K::String => self.string(v.as_str().unwrap_or_default(), out),
            K::Seq | K::Iterable => {
                let items: Vec<Value> = v.try_iter()?.collect();
                out.push('[');
                for (i, x) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(&self.item_sep);
                    }
                    self.newline(depth + 1, out);
                    self.value(x, depth + 1, out)?;
                }
                if !items.is_empty() {
                    self.newline(depth, out);
                }
                out.push(']');
            }
            K::Map => {
                let mut entries = Vec::new();
                for k in v.try_iter()? {
                    let item = v.get_item(&k)?;
                    entries.push((self.key(&k)?, item));
                }
                if self.sort_keys {
                    entries.sort_by(|a, b| a.0.cmp(&b.0));
                }
                out.push('{');
                for (i, (k, x)) in entries.iter().enumerate() {
                    if i > 0 {
                        out.push_str(&self.item_sep);
                    }
                    self.newline(depth + 1, out);
                    self.string(k, out);
                    out.push_str(&self.key_sep);
                    self.value(x, depth + 1, out)?;
                }
                if !entries.is_empty() {
                    self.newline(depth, out);
                }
                out.push('}');
            }
            other => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("tojson: Object of type {other} is not JSON serializable"),
                ))
            }
        }
        Ok(())
    }
}

/// A float as `json.dumps` writes it: Python's `repr`, `NaN`, `Infinity`, `-Infinity`.
fn json_float(f: f64) -> String {
    if f.is_nan() {
        "NaN".into()
    } else if f.is_infinite() {
        if f > 0.0 { "Infinity" } else { "-Infinity" }.into()
    } else {
        py_float_repr(f)
    }
}

/// Jinja2's `wordcount` filter: the number of runs of word characters (`\w`: letters,
/// digits, `_`) in the text.
pub fn wordcount(text: &str) -> usize {
    let mut n = 0;
    let mut in_word = false;
    for c in text.chars() {
        let w = c.is_alphanumeric() || c == '_';
        if w && !in_word {
            n += 1;
        }
        in_word = w;
    }
    n
}

/// `strftime_now(format)`: the current local time (the process's time zone, as Python's
/// `datetime.now()`), formatted by [`format_time`].
pub fn strftime_now(format: String) -> Result<String, Error> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, e.to_string()))?
        .as_secs() as i64;
    Ok(format_time(now + local_offset_secs(now), &format))
}

/// Seconds east of UTC of the local time zone at Unix time `secs` (`localtime_r`'s
/// `tm_gmtoff`; 0 when the C library cannot tell).
pub fn local_offset_secs(secs: i64) -> i64 {
    let t = secs as libc::time_t;
    // SAFETY: `tm` is plain data written by localtime_r, which reads only `t`.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    let ok = unsafe { !libc::localtime_r(&t, &mut tm).is_null() };
    if ok {
        tm.tm_gmtoff
    } else {
        0
    }
}

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
const DAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// Formats `secs` (seconds since 1970-01-01 00:00 of the wall clock to show: local time is
/// Unix time plus [`local_offset_secs`]) with C `strftime` codes
/// (`%Y %m %d %e %H %M %S %y %j %B %b %A %a %p %I %%` and glibc's `%-d`, `%-m`, `%-H`, `%-I`);
/// unknown codes are kept literally. Civil date from days: H. Hinnant, "chrono-Compatible
/// Low-Level Date Algorithms" (`civil_from_days`).
pub fn format_time(secs: i64, format: &str) -> String {
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    let (h, mi, s) = (sod / 3600, sod % 3600 / 60, sod % 60);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy_mar = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy_mar + 2) / 153;
    let d = doy_mar - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    let cum = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = cum[(m - 1) as usize] + d + i64::from(leap && m > 2);
    let wday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday.
    let h12 = if h % 12 == 0 { 12 } else { h % 12 };

    let mut out = String::new();
    let mut it = format.chars();
    while let Some(c) = it.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let mut code = it.next();
        let no_pad = code == Some('-');
        if no_pad {
            code = it.next();
        }
        let num = |v: i64, w: usize| {
            if no_pad {
                v.to_string()
            } else {
                format!("{v:0w$}")
            }
        };
        match code {
            Some('Y') => out.push_str(&y.to_string()),
            Some('y') => out.push_str(&num(y.rem_euclid(100), 2)),
            Some('m') => out.push_str(&num(m, 2)),
            Some('d') => out.push_str(&num(d, 2)),
            Some('e') => out.push_str(&format!("{d:2}")),
            Some('H') => out.push_str(&num(h, 2)),
            Some('I') => out.push_str(&num(h12, 2)),
            Some('M') => out.push_str(&num(mi, 2)),
            Some('S') => out.push_str(&num(s, 2)),
            Some('j') => out.push_str(&num(yday, 3)),
            Some('p') => out.push_str(if h < 12 { "AM" } else { "PM" }),
            Some('B') => out.push_str(MONTHS[(m - 1) as usize]),
            Some('b') => out.push_str(&MONTHS[(m - 1) as usize][..3]),
            Some('A') => out.push_str(DAYS[wday]),
            Some('a') => out.push_str(&DAYS[wday][..3]),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                if no_pad {
                    out.push('-');
                }
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_print_as_python_repr() {
        for (f, want) in [
            (1e20, "1e+20"),
            (1e-7, "1e-07"),
            (1.5e-7, "1.5e-07"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (1234567890123456.0, "1234567890123456.0"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (0.1, "0.1"),
            (100.0, "100.0"),
            (0.0, "0.0"),
            (-0.0, "-0.0"),
            (-2.5e300, "-2.5e+300"),
            (f64::NAN, "nan"),
            (f64::NEG_INFINITY, "-inf"),
        ] {
            assert_eq!(py_float_repr(f), want, "{f:e}");
        }
    }

    #[test]
    fn strings_repr_as_python() {
        assert_eq!(py_str_repr("a'b"), "\"a'b\"");
        assert_eq!(py_str_repr("a'b\""), "'a\\'b\"'");
        assert_eq!(py_str_repr("x\ny\u{1}é"), "'x\\ny\\x01é'");
    }

    /// Run by [`strftime_now_uses_the_local_time_zone`] in a child process with `TZ` set.
    #[test]
    #[ignore = "run in a child process with TZ set"]
    fn local_time_child() {
        // POSIX TZ "XST-05:30": 5 h 30 min east of UTC, no tz database needed.
        assert_eq!(local_offset_secs(0), 19_800);
        assert_eq!(local_offset_secs(1_709_211_909), 19_800);
        let before = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        let got = strftime_now("%Y-%m-%d %H:%M".into()).unwrap();
        let after = before + 60;
        assert!(
            [before, after]
                .iter()
                .any(|t| format_time(t + 19_800, "%Y-%m-%d %H:%M") == got),
            "{got}"
        );
    }

    #[test]
    fn strftime_now_uses_the_local_time_zone() {
        let exe = std::env::current_exe().unwrap();
        let out = std::process::Command::new(exe)
            .args([
                "--exact",
                "tokenizer::chat_py::tests::local_time_child",
                "--ignored",
                "--test-threads=1",
            ])
            .env("TZ", "XST-05:30")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains("1 passed"),
            "{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    #[test]
    fn format_time_known_instants() {
        // 2024-02-29 13:05:09 UTC, a Thursday, day 60 of a leap year.
        let t = 1_709_211_909;
        assert_eq!(format_time(t, "%Y-%m-%d %H:%M:%S"), "2024-02-29 13:05:09");
        assert_eq!(format_time(t, "%d %b %Y"), "29 Feb 2024");
        assert_eq!(
            format_time(t, "%A %B %-d, %j %I%p %y %e %% %q"),
            "Thursday February 29, 060 01PM 24 29 % %q"
        );
        // 1970-01-01 00:00:00 and a date before the epoch.
        assert_eq!(format_time(0, "%a %Y-%m-%d %-H"), "Thu 1970-01-01 0");
        assert_eq!(format_time(-86_400, "%Y-%m-%d %a"), "1969-12-31 Wed");
    }
}
