//! Jinja2's answers where minijinja's built-in tests and filters answer otherwise: transformers
//! renders chat templates with Jinja2 3.1, whose tests and filters follow Python's data model,
//! and templates branch on them (`tools is iterable and tools | length > 0`). [`add_to_environment`]
//! replaces the differing tests and filters of an environment; the truth table they are checked
//! against is tests/fixtures/chat_templates/jinja2_semantics.json (rendered by Jinja2 itself).
//!
//! What differs, in Python's terms (`None` is a value, `Undefined` a missing variable or key):
//! - `iterable`: `None`, numbers and booleans are not (minijinja iterates `none` as empty);
//!   `Undefined` is. `sequence`: strings, mappings and `Undefined` are sequences (they have a
//!   length and items), `None` is not. `callable`: functions, macros and `Undefined` are.
//! - `odd`, `even`, `divisibleby`, `gt`/`ge`/`lt`/`le` (and `>`, `greaterthan`, …): Python's
//!   `%` and ordering; `None`, strings against numbers, mappings raise (`TypeError`),
//!   `Undefined` raises (`UndefinedError`); booleans count as 0 and 1.
//! - `in`: `x in none` and a non-string in a string raise. `lower`/`upper`: on `str(x)`.
//! - `filter`/`test`: a non-string name answers false, a list or mapping raises (unhashable).
//! - The filters that iterate (`batch`, `slice`, `groupby`, `join`, `list`, `max`, `min`,
//!   `sort`, `sum`, `unique`) raise on `None` (minijinja treats it as empty); `select`,
//!   `reject`, `selectattr`, `rejectattr`, `map` give `[]` for any false value (0, `false`);
//!   sorting, `max`/`min`, `groupby` raise on keys Python cannot order (`None`, mappings,
//!   mixed types) and `unique` on unhashable items; `groupby` raises on a missing attribute.
//! - `int`/`float`: Python's conversion with the default (0, 0.0) on any failure, `Undefined`
//!   raises. `abs`/`round` take booleans. `attr` reads attributes only (a mapping has none).
//! - `escape`/`e`: markupsafe's entities (`&#39;`, `&#34;`) on `str(x)`. `format` and `center`
//!   format `str(x)`; `indent` and `truncate` take strings (`Undefined`: empty; `None` raises).
//!
//! Not covered (minijinja's VM, not a test or filter): `for x in none` iterates nothing,
//! comparison operators (`none > 0`) answer instead of raising, slicing `None` or `Undefined`
//! gives `[]`. A `namespace()` is a mapping to minijinja (`is mapping`, `attr` see a dict).

use std::borrow::Cow;
use std::cmp::Ordering;

use minijinja::value::{Kwargs, Rest, StringInput, ValueKind as K, ValueOrKwargs};
use minijinja::{filters, tests, Environment, Error, ErrorKind, State, Value};

use super::chat_py::py_text;

/// Replaces minijinja's tests and filters that answer otherwise than Jinja2 3.1 (module docs).
pub fn add_to_environment(env: &mut Environment) {
    env.add_test("iterable", is_iterable);
    env.add_test("sequence", is_sequence);
    env.add_test("callable", is_callable);
    env.add_test("odd", |v: &Value| {
        Ok::<_, Error>(py_mod(v, &Value::from(2))? == 1.0)
    });
    env.add_test("even", |v: &Value| {
        Ok::<_, Error>(py_mod(v, &Value::from(2))? == 0.0)
    });
    env.add_test("divisibleby", |v: &Value, n: &Value| {
        Ok::<_, Error>(py_mod(v, n)? == 0.0)
    });
    for (names, want) in [
        (&[">", "gt", "greaterthan"][..], &[Ordering::Greater][..]),
        (&[">=", "ge"][..], &[Ordering::Greater, Ordering::Equal][..]),
        (&["<", "lt", "lessthan"][..], &[Ordering::Less][..]),
        (&["<=", "le"][..], &[Ordering::Less, Ordering::Equal][..]),
    ] {
        for name in names {
            env.add_test(*name, move |a: &Value, b: &Value| {
                Ok::<_, Error>(py_cmp(a, b)?.is_some_and(|o| want.contains(&o)))
            });
        }
    }
    env.add_test("in", is_in);
    env.add_test("lower", |v: &Value| py_case(v, true));
    env.add_test("upper", |v: &Value| py_case(v, false));
    env.add_test("filter", |state: &State, v: &Value| {
        named(v, |n| tests::is_filter(state, n))
    });
    env.add_test("test", |state: &State, v: &Value| {
        named(v, |n| tests::is_test(state, n))
    });

    env.add_filter(
        "batch",
        |s: &State, v: Value, n: usize, fill: Option<Value>| {
            filters::batch(s, iterable(v)?, n, fill)
        },
    );
    env.add_filter(
        "slice",
        |s: &State, v: Value, n: usize, fill: Option<Value>| {
            filters::slice(s, iterable(v)?, n, fill)
        },
    );
    env.add_filter("groupby", groupby);
    env.add_filter(
        "join",
        |s: &mut State, v: Value, j: Option<StringInput<'_>>, a: Option<&str>, kw: Kwargs| {
            let v = iterable(v)?;
            filters::join(s, &v, j, a, kw)
        },
    );
    env.add_filter("list", |s: &State, v: Value| filters::list(s, iterable(v)?));
    env.add_filter("max", |s: &State, v: Value, kw: Kwargs| {
        let v = orderable(iterable(v)?, &kw, false)?;
        filters::max(s, v, kw)
    });
    env.add_filter("min", |s: &State, v: Value, kw: Kwargs| {
        let v = orderable(iterable(v)?, &kw, false)?;
        filters::min(s, v, kw)
    });
    env.add_filter("sort", |s: &State, v: Value, kw: Kwargs| {
        let v = iterable(v)?;
        if kw.peek::<Option<String>>("attribute")?.is_some() && !v.is_undefined() {
            // Jinja2 compares `[key]` lists, which compare equal keys (`Undefined` ones among
            // them) as equal without ordering them: all-undefined keys keep the order.
            orderable(v.clone(), &kw, true)?;
            let items: Vec<Value> = v.try_iter()?.collect();
            let attr: String = kw.peek("attribute")?;
            if items
                .iter()
                .all(|x| attribute(x, &attr).is_ok_and(|k| k.is_undefined()))
            {
                let _ = kw.get::<Value>("attribute");
                let _ = kw.get::<Option<Value>>("reverse");
                let _ = kw.get::<Option<Value>>("case_sensitive");
                kw.assert_all_used()?;
                return Ok(Value::from(items));
            }
            return filters::sort(s, v, kw);
        }
        let v = orderable(v, &kw, false)?;
        filters::sort(s, v, kw)
    });
    env.add_filter(
        "sum",
        |s: &State, v: Value, a: Option<&str>, start: Option<Value>, kw: Kwargs| {
            filters::sum(s, iterable(v)?, a, start, kw)
        },
    );
    env.add_filter("unique", |s: &State, v: Value, kw: Kwargs| {
        let v = iterable(v)?;
        for x in v.try_iter()? {
            if matches!(x.kind(), K::Seq | K::Map) {
                return Err(type_error(format!("unhashable type: '{}'", py_type(&x))));
            }
        }
        filters::unique(s, v, kw)
    });
    type Args = Rest<ValueOrKwargs>;
    env.add_filter(
        "select",
        |s: &mut State, v: Value, t: Option<Cow<'_, str>>, args: Args| {
            when_true(v, |v| filters::select(s, v, t, args))
        },
    );
    env.add_filter(
        "reject",
        |s: &mut State, v: Value, t: Option<Cow<'_, str>>, args: Args| {
            when_true(v, |v| filters::reject(s, v, t, args))
        },
    );
    env.add_filter(
        "selectattr",
        |s: &mut State, v: Value, a: Cow<'_, str>, t: Option<Cow<'_, str>>, args: Args| {
            when_true(v, |v| filters::selectattr(s, v, a, t, args))
        },
    );
    env.add_filter(
        "rejectattr",
        |s: &mut State, v: Value, a: Cow<'_, str>, t: Option<Cow<'_, str>>, args: Args| {
            when_true(v, |v| filters::rejectattr(s, v, a, t, args))
        },
    );
    env.add_filter("map", |s: &mut State, v: Value, args: Args| {
        when_true(v, |v| filters::map(s, v, args))
    });
    env.add_filter("int", py_int);
    env.add_filter("float", py_float);
    env.add_filter("abs", |v: Value| filters::abs(bool_as_int(v)));
    env.add_filter(
        "round",
        |v: Value, p: Option<i32>, m: Option<&str>, kw: Kwargs| {
            filters::round(bool_as_int(v), p, m, kw)
        },
    );
    env.add_filter("attr", |v: &Value, name: &Value| match v.kind() {
        K::Undefined => Err(Error::from(ErrorKind::UndefinedError)),
        K::Plain => filters::attr(v, name),
        _ => Ok(Value::UNDEFINED),
    });
    env.add_filter("escape", escape);
    env.add_filter("e", escape);
    env.add_filter("format", |s: &mut State, v: &Value, args: Args| {
        let text = match v.kind() {
            K::String => v.clone(),
            _ => Value::from(py_text(v, false)?),
        };
        filters::format(s, &text, args)
    });
    env.add_filter("center", |v: &Value, width: Option<usize>| {
        Ok::<_, Error>(center(&py_text(v, false)?, width.unwrap_or(80)))
    });
    env.add_filter("indent", |s: &State, v: &Value, args: Args| {
        string_only(v, "indent")?;
        let [w, first, blank] = py_args(&args, ["width", "first", "blank"])?;
        let width = match w.kind() {
            K::Undefined | K::None => 4,
            _ => usize::try_from(w)?,
        };
        let none = Kwargs::from_iter(std::iter::empty::<(&str, Value)>());
        let text = StringInput::new(s, v)?;
        filters::indent(
            text,
            Some(width),
            Some(first.is_true()),
            Some(blank.is_true()),
            none,
        )
    });
    env.add_filter("truncate", truncate);
}

/// Python-style arguments: positional in the order of `names`, or by name; missing ones
/// undefined. Errors: more positional arguments than names, unknown names.
fn py_args<const N: usize>(args: &[ValueOrKwargs], names: [&str; N]) -> Result<[Value; N], Error> {
    let mut out: [Value; N] = std::array::from_fn(|_| Value::UNDEFINED);
    for (i, a) in args.iter().enumerate() {
        if a.is_kwargs() {
            let kw = Kwargs::try_from(Value::from(a.clone()))?;
            for (j, name) in names.iter().enumerate() {
                if let Some(x) = kw.get::<Option<Value>>(name)? {
                    out[j] = x;
                }
            }
            kw.assert_all_used()?;
        } else if i < N {
            out[i] = Value::from(a.clone());
        } else {
            return Err(Error::from(ErrorKind::TooManyArguments));
        }
    }
    Ok(out)
}

fn type_error(msg: impl Into<Cow<'static, str>>) -> Error {
    Error::new(ErrorKind::InvalidOperation, msg)
}

/// Python's type name of a value, for error messages.
fn py_type(v: &Value) -> &'static str {
    match v.kind() {
        K::Undefined => "Undefined",
        K::None => "NoneType",
        K::Bool => "bool",
        K::Number if v.is_integer() => "int",
        K::Number => "float",
        K::String => "str",
        K::Bytes => "bytes",
        K::Seq => "list",
        K::Map => "dict",
        K::Iterable => "generator",
        _ => "object",
    }
}

fn is_iterable(v: &Value) -> bool {
    match v.kind() {
        K::Undefined | K::String | K::Bytes | K::Seq | K::Map | K::Iterable => true,
        K::None | K::Bool | K::Number | K::Invalid => false,
        _ => v.try_iter().is_ok(),
    }
}

fn is_sequence(v: &Value) -> bool {
    match v.kind() {
        K::Undefined | K::String | K::Bytes | K::Seq | K::Map => true,
        K::Plain => v.len().is_some(),
        _ => false,
    }
}

fn is_callable(v: &Value) -> bool {
    match v.kind() {
        K::Undefined | K::Plain => true,
        // Macros and the loop object are map-like objects in minijinja; they print as
        // `<macro name>` and `<loop i/n>` (a mapping prints as `{…}`).
        K::Map => {
            let text = v.to_string();
            text.starts_with("<macro ") || text.starts_with("<loop ")
        }
        _ => false,
    }
}

/// A number as Python sees it in arithmetic (booleans are 0 and 1); `Undefined` raises
/// `UndefinedError`, any other value a type error naming `op`.
fn py_number(v: &Value, op: &str, other: &Value) -> Result<f64, Error> {
    match v.kind() {
        K::Bool => Ok(if v.is_true() { 1.0 } else { 0.0 }),
        K::Number => f64::try_from(v.clone()),
        K::Undefined => Err(Error::from(ErrorKind::UndefinedError)),
        _ => Err(type_error(format!(
            "unsupported operand type(s) for {op}: '{}' and '{}'",
            py_type(v),
            py_type(other)
        ))),
    }
}

/// Python's `v % n` (the sign of `n`), as a float.
fn py_mod(v: &Value, n: &Value) -> Result<f64, Error> {
    if n.is_undefined() {
        return Err(Error::from(ErrorKind::UndefinedError));
    }
    let a = py_number(v, "%", n)?;
    let b = py_number(n, "%", v)?;
    if b == 0.0 {
        return Err(type_error("ZeroDivisionError: modulo by zero"));
    }
    let r = a % b;
    Ok(if r != 0.0 && (r < 0.0) != (b < 0.0) {
        r + b
    } else {
        r
    })
}

/// Python's ordering of two values: numbers (booleans among them) with numbers, strings with
/// strings, lists item by item. `None` (`NaN` when either is a NaN). Errors: `Undefined` on
/// either side; values Python cannot order (`None`, mappings, mixed types).
fn py_cmp(a: &Value, b: &Value) -> Result<Option<Ordering>, Error> {
    if a.is_undefined() || b.is_undefined() {
        return Err(Error::from(ErrorKind::UndefinedError));
    }
    let numeric = |v: &Value| matches!(v.kind(), K::Bool | K::Number);
    match (a.kind(), b.kind()) {
        _ if numeric(a) && numeric(b) => {
            let (x, y) = (bool_as_int(a.clone()), bool_as_int(b.clone()));
            Ok(x.partial_cmp(&y))
        }
        (K::String, K::String) => Ok(a.as_str().partial_cmp(&b.as_str())),
        (K::Seq, K::Seq) => {
            let xs: Vec<Value> = a.try_iter()?.collect();
            let ys: Vec<Value> = b.try_iter()?.collect();
            for (x, y) in xs.iter().zip(&ys) {
                if x != y {
                    return py_cmp(x, y);
                }
            }
            Ok(Some(xs.len().cmp(&ys.len())))
        }
        _ => Err(type_error(format!(
            "'<' not supported between instances of '{}' and '{}'",
            py_type(a),
            py_type(b)
        ))),
    }
}

fn bool_as_int(v: Value) -> Value {
    match v.kind() {
        K::Bool => Value::from(i64::from(v.is_true())),
        _ => v,
    }
}

/// `value in seq`, as Python: in a string only a string; nothing is in `Undefined`; `None` and
/// numbers hold nothing (they raise); a mapping's keys must be hashable.
fn is_in(state: &State, v: &Value, seq: &Value) -> Result<bool, Error> {
    match seq.kind() {
        K::Undefined => Ok(false),
        K::String if v.kind() != K::String => Err(type_error(format!(
            "'in <string>' requires string as left operand, not {}",
            py_type(v)
        ))),
        K::Map if matches!(v.kind(), K::Seq | K::Map) => {
            Err(type_error(format!("unhashable type: '{}'", py_type(v))))
        }
        K::String | K::Seq | K::Map | K::Iterable | K::Plain => tests::is_in(state, v, seq),
        _ => Err(type_error(format!(
            "argument of type '{}' is not iterable",
            py_type(seq)
        ))),
    }
}

/// `str(v).islower()` (`lower`) or `str(v).isupper()`: some cased character, none of the
/// other case.
fn py_case(v: &Value, lower: bool) -> Result<bool, Error> {
    let text = py_text(v, false)?;
    let mut cased = false;
    for c in text.chars() {
        let (same, other) = if lower {
            (c.is_lowercase(), c.is_uppercase())
        } else {
            (c.is_uppercase(), c.is_lowercase())
        };
        if other {
            return Ok(false);
        }
        cased |= same;
    }
    Ok(cased)
}

/// The `filter`/`test` tests: `name in environment.filters` (a non-string is no name; a list
/// or mapping is unhashable).
fn named(v: &Value, lookup: impl Fn(&str) -> bool) -> Result<bool, Error> {
    match v.kind() {
        K::String => Ok(lookup(v.as_str().unwrap_or_default())),
        K::Seq | K::Map => Err(type_error(format!("unhashable type: '{}'", py_type(v)))),
        _ => Ok(false),
    }
}

/// The value, unless Python cannot iterate it (`None`, numbers, booleans).
fn iterable(v: Value) -> Result<Value, Error> {
    if matches!(v.kind(), K::None | K::Bool | K::Number) {
        return Err(type_error(format!(
            "'{}' object is not iterable",
            py_type(&v)
        )));
    }
    Ok(v)
}

/// `f(v)` for a true value, `[]` for a false one (Jinja2's `if value:` guard).
fn when_true(
    v: Value,
    f: impl FnOnce(Value) -> Result<Vec<Value>, Error>,
) -> Result<Vec<Value>, Error> {
    if v.is_true() {
        f(v)
    } else {
        Ok(Vec::new())
    }
}

/// The attribute `path` (`a.b`, digits index lists) of `item`, as Jinja2's
/// `make_attrgetter`.
fn attribute(item: &Value, path: &str) -> Result<Value, Error> {
    let mut v = item.clone();
    for part in path.split('.') {
        v = match part.parse::<i64>() {
            Ok(i) => v.get_item(&Value::from(i))?,
            Err(_) => v.get_attr(part)?,
        };
    }
    Ok(v)
}

/// The value, after checking Python could order its items (or their `attribute`): two or more
/// keys must be all numbers, all strings or all lists; `Undefined` keys raise.
fn orderable(v: Value, kw: &Kwargs, equal_ok: bool) -> Result<Value, Error> {
    let attr: Option<String> = kw.peek::<Option<String>>("attribute")?;
    if v.is_undefined() {
        return Ok(v);
    }
    let mut keys = Vec::new();
    for x in v.try_iter()? {
        keys.push(match &attr {
            Some(a) => attribute(&x, a)?,
            None => x,
        });
    }
    check_order(&keys, equal_ok)?;
    Ok(v)
}

/// Whether Python could sort `keys`, checked on neighbours; `equal_ok`: equal keys need no
/// ordering (keys compared inside lists).
fn check_order(keys: &[Value], equal_ok: bool) -> Result<(), Error> {
    for w in keys.windows(2) {
        if !(equal_ok && w[0] == w[1]) {
            py_cmp(&w[0], &w[1])?;
        }
    }
    Ok(())
}

/// `groupby(attribute, default=None, case_sensitive=False)`: a missing attribute without a
/// default raises; the keys must be orderable.
fn groupby(v: Value, attr: Option<&str>, kw: Kwargs) -> Result<Value, Error> {
    let v = iterable(v)?;
    let path = match attr {
        Some(a) => Some(a.to_string()),
        None => kw.peek::<Option<String>>("attribute")?,
    };
    let default: Option<Value> = kw.peek::<Option<Value>>("default")?;
    if let (Some(path), false) = (&path, v.is_undefined()) {
        let mut keys = Vec::new();
        for x in v.try_iter()? {
            let k = attribute(&x, path)?;
            if k.is_undefined() {
                match &default {
                    Some(d) => keys.push(d.clone()),
                    None => return Err(Error::from(ErrorKind::UndefinedError)),
                }
            } else {
                keys.push(k);
            }
        }
        check_order(&keys, false)?;
    }
    filters::groupby(v, attr, kw)
}

/// Python's `int(x)` (`int(x, base)` for a string), `default` (0) where it fails: strings
/// as integers (a `0x`/`0o`/`0b` prefix matching the base, base 0 reading the prefix) or as
/// floats truncated, floats truncated, booleans as 0 and 1. Arguments `default`, `base` (10),
/// positional or by name. Errors: `Undefined`; an unknown argument.
fn py_int(v: &Value, args: Rest<ValueOrKwargs>) -> Result<Value, Error> {
    let [default, base] = py_args(&args, ["default", "base"])?;
    let default = if default.is_undefined() {
        Value::from(0)
    } else {
        default
    };
    let base = if base.is_undefined() {
        10
    } else {
        u32::try_from(base)?
    };
    Ok(match v.kind() {
        K::Undefined => return Err(Error::from(ErrorKind::UndefinedError)),
        K::Bool => Value::from(i64::from(v.is_true())),
        K::Number if v.is_integer() => v.clone(),
        K::Number => trunc(f64::try_from(v.clone())?).unwrap_or(default),
        K::String => {
            let s = py_num_text(v.as_str().unwrap_or_default());
            match py_int_text(&s, base) {
                Some(i) => Value::from(i),
                None if base == 10 => py_float_text(&s).and_then(trunc).unwrap_or(default),
                None => default,
            }
        }
        _ => default,
    })
}

/// An integer's text in `base` (2 to 36, or 0: the prefix decides), sign and prefix allowed.
fn py_int_text(s: &str, base: u32) -> Option<i64> {
    let (neg, body) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let lower = body.to_ascii_lowercase();
    let prefixed = [("0x", 16), ("0o", 8), ("0b", 2)]
        .into_iter()
        .find(|(p, b)| lower.starts_with(p) && (base == *b || base == 0));
    let (digits, radix) = match prefixed {
        Some((p, b)) => (&lower[p.len()..], b),
        None if base == 0 => (lower.as_str(), 10),
        None => (lower.as_str(), base),
    };
    if digits.is_empty() || digits.starts_with(['+', '-']) || !(2..=36).contains(&radix) {
        return None;
    }
    let n = i64::from_str_radix(digits, radix).ok()?;
    Some(if neg { -n } else { n })
}

/// Python's `float(x)`, `default` (0.0; positional or by name) where it fails. Errors:
/// `Undefined`; an unknown argument.
fn py_float(v: &Value, args: Rest<ValueOrKwargs>) -> Result<Value, Error> {
    let [default] = py_args(&args, ["default"])?;
    let default = if default.is_undefined() {
        Value::from(0.0)
    } else {
        default
    };
    Ok(match v.kind() {
        K::Undefined => return Err(Error::from(ErrorKind::UndefinedError)),
        K::Bool => Value::from(if v.is_true() { 1.0 } else { 0.0 }),
        K::Number => Value::from(f64::try_from(v.clone())?),
        K::String => py_float_text(&py_num_text(v.as_str().unwrap_or_default()))
            .map(Value::from)
            .unwrap_or(default),
        _ => default,
    })
}

/// A number's text as Python reads it: surrounding whitespace dropped, `_` between digits.
fn py_num_text(s: &str) -> String {
    let t = s.trim();
    let b = t.as_bytes();
    let ok = (0..b.len()).all(|i| {
        b[i] != b'_'
            || (i > 0 && i + 1 < b.len() && b[i - 1].is_ascii_alphanumeric())
                && b[i + 1].is_ascii_alphanumeric()
    });
    if ok {
        t.replace('_', "")
    } else {
        t.to_string()
    }
}

fn py_float_text(s: &str) -> Option<f64> {
    let lower = s.to_ascii_lowercase();
    let body = lower.trim_start_matches(['+', '-']);
    let special = ["inf", "infinity", "nan"].contains(&body);
    let digits = !body.is_empty()
        && body
            .bytes()
            .all(|c| c.is_ascii_digit() || matches!(c, b'.' | b'e' | b'+' | b'-'));
    if special || digits {
        s.parse::<f64>().ok()
    } else {
        None
    }
}

fn trunc(f: f64) -> Option<Value> {
    (f.is_finite()).then(|| Value::from(f.trunc() as i64))
}

/// markupsafe's `escape`: `str(x)` with `&`, `<`, `>`, `'`, `"` as entities; safe strings as
/// they are.
fn escape(v: &Value) -> Result<Value, Error> {
    if v.is_safe() {
        return Ok(v.clone());
    }
    let text = py_text(v, false)?;
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '\'' => out.push_str("&#39;"),
            '"' => out.push_str("&#34;"),
            c => out.push(c),
        }
    }
    Ok(Value::from_safe_string(out))
}

/// Python's `str.center(width)`: the odd space goes right unless `width` is odd and the
/// text's length even.
fn center(text: &str, width: usize) -> String {
    let len = text.chars().count();
    if len >= width {
        return text.to_string();
    }
    let pad = width - len;
    let left = pad / 2 + (pad & width & 1);
    format!("{}{text}{}", " ".repeat(left), " ".repeat(pad - left))
}

/// The text of a filter that takes strings only: `Undefined` raises `UndefinedError`, other
/// values a type error.
fn string_only(v: &Value, filter: &str) -> Result<String, Error> {
    match v.kind() {
        K::String => Ok(v.as_str().unwrap_or_default().to_string()),
        K::Undefined => Err(Error::from(ErrorKind::UndefinedError)),
        _ => Err(type_error(format!(
            "{filter} expects a string, not '{}'",
            py_type(v)
        ))),
    }
}

/// Jinja2's `truncate(length=255, killwords=False, end='...', leeway=5)`: a text within
/// `length + leeway` characters unchanged, otherwise cut to `length - len(end)` (at the last
/// space unless `killwords`) followed by `end`. Errors: `None` and numbers (no length);
/// containers too long to pass unchanged.
fn truncate(v: &Value, args: Rest<ValueOrKwargs>) -> Result<Value, Error> {
    let opt = py_args(&args, ["length", "killwords", "end", "leeway"])?;
    let num = |x: &Value, d: usize| -> Result<usize, Error> {
        match x.kind() {
            K::Undefined | K::None => Ok(d),
            _ => usize::try_from(x.clone()),
        }
    };
    let length = num(&opt[0], 255)?;
    let killwords = opt[1].is_true();
    let end = match opt[2].as_str() {
        Some(e) => e.to_string(),
        None => "...".to_string(),
    };
    let leeway = num(&opt[3], 5)?;
    let len = match v.kind() {
        K::Undefined => return Ok(v.clone()),
        K::String => v.as_str().unwrap_or_default().chars().count(),
        K::Seq | K::Map => v.len().unwrap_or(0),
        _ => {
            return Err(type_error(format!(
                "object of type '{}' has no len()",
                py_type(v)
            )))
        }
    };
    if len <= length + leeway {
        return Ok(v.clone());
    }
    let Some(s) = v.as_str() else {
        return Err(type_error("truncate: only a string can be cut"));
    };
    let keep: String = s
        .chars()
        .take(length.saturating_sub(end.chars().count()))
        .collect();
    let cut = if killwords {
        keep
    } else {
        match keep.rsplit_once(' ') {
            Some((head, _)) => head.to_string(),
            None => keep,
        }
    };
    Ok(Value::from(cut + &end))
}
