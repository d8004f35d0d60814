//! `tojson` as transformers defines it for chat templates:
//! `json.dumps(x, ensure_ascii=False, indent=None)` — `", "` and `": "` separators (`","` and
//! `": "` with an indent), keys in insertion order, non-ASCII kept (or `\uXXXX`-escaped with
//! `ensure_ascii=true`), floats in Python `repr` style. minijinja's own `tojson` is compact and
//! HTML-escapes, which would change the prompt's tokens.

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Error, ErrorKind, Value};

struct Style {
    indent: Option<usize>,
    ensure_ascii: bool,
}

pub fn tojson(v: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    kwargs.assert_all_used()?;
    let style = Style { indent, ensure_ascii: ensure_ascii.unwrap_or(false) };
    let mut out = String::new();
    write(&v, &mut out, &style, 0)?;
    Ok(Value::from_safe_string(out))
}

fn newline(out: &mut String, style: &Style, depth: usize) {
    if let Some(n) = style.indent {
        out.push('\n');
        out.push_str(&" ".repeat(n * depth));
    }
}

fn write(v: &Value, out: &mut String, style: &Style, depth: usize) -> Result<(), Error> {
    let item_sep = if style.indent.is_some() { "," } else { ", " };
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => out.push_str(&number(v)),
        ValueKind::String => string(v.as_str().unwrap_or_default(), out, style.ensure_ascii),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, style, depth + 1);
                write(item, out, style, depth + 1)?;
            }
            if !items.is_empty() {
                newline(out, style, depth);
            }
            out.push(']');
        }
        ValueKind::Map => {
            let keys: Vec<Value> = v.try_iter()?.collect();
            out.push('{');
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, style, depth + 1);
                string(&k.to_string(), out, style.ensure_ascii);
                out.push_str(": ");
                write(&v.get_item(k)?, out, style, depth + 1)?;
            }
            if !keys.is_empty() {
                newline(out, style, depth);
            }
            out.push('}');
        }
        _ => return Err(Error::new(ErrorKind::InvalidOperation, "value is not JSON-serializable")),
    }
    Ok(())
}

fn number(v: &Value) -> String {
    if v.is_integer() {
        return v.to_string();
    }
    match f64::try_from(v.clone()) {
        Ok(f) => python_float_repr(f),
        Err(_) => v.to_string(),
    }
}

/// Python's `repr(float)`: shortest round-trip digits, fixed notation for exponents in
/// [-4, 16), otherwise `d.ddde+XX` with at least two exponent digits.
pub(crate) fn python_float_repr(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity".into() } else { "-Infinity".into() };
    }
    if f == 0.0 {
        return if f.is_sign_negative() { "-0.0".into() } else { "0.0".into() };
    }
    let sci = format!("{:e}", f.abs());
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let sign = if f < 0.0 { "-" } else { "" };
    if (-4..16).contains(&exp) {
        let body = if exp >= 0 {
            let int_len = exp as usize + 1;
            if digits.len() <= int_len {
                format!("{digits}{}.0", "0".repeat(int_len - digits.len()))
            } else {
                format!("{}.{}", &digits[..int_len], &digits[int_len..])
            }
        } else {
            format!("0.{}{digits}", "0".repeat((-exp - 1) as usize))
        };
        format!("{sign}{body}")
    } else {
        let esign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{mantissa}e{esign}{:02}", exp.abs())
    }
}

fn string(s: &str, out: &mut String, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c if ensure_ascii && !c.is_ascii() => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    out.push_str(&format!("\\u{:04x}", unit));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_print_like_python_repr() {
        let cases = [
            (1e16, "1e+16"), (1.5e-7, "1.5e-07"), (0.0001, "0.0001"), (1e-5, "1e-05"), (2.5, "2.5"), (100.0, "100.0"),
            (1e22, "1e+22"), (0.1, "0.1"), (-3.25, "-3.25"), (123456789012345.6, "123456789012345.6"), (9999999999999998.0, "9999999999999998.0"),
            (-0.0, "-0.0"), (1.7976931348623157e308, "1.7976931348623157e+308"), (5e-324, "5e-324"),
        ];
        for (f, want) in cases {
            assert_eq!(python_float_repr(f), want, "{f:?}");
        }
    }

    #[test]
    fn tojson_matches_json_dumps() {
        let mut env = minijinja::Environment::new();
        env.add_filter("tojson", tojson);
        let v: serde_json::Value = serde_json::from_str(r#"{"b": 1, "a": [1.0, 2.5, "é\n\"\u0001", null, true, {}], "c": 1e20}"#).unwrap();
        let ctx = minijinja::context! { v => crate::chat::to_value(&v) };
        let out = env.render_str("{{ v | tojson }}", ctx.clone()).unwrap();
        assert_eq!(out, r#"{"b": 1, "a": [1.0, 2.5, "é\n\"\u0001", null, true, {}], "c": 1e+20}"#);
        let ascii = env.render_str("{{ v.a | tojson(ensure_ascii=true) }}", ctx.clone()).unwrap();
        assert_eq!(ascii, r#"[1.0, 2.5, "\u00e9\n\"\u0001", null, true, {}]"#);
        let indented = env.render_str("{{ v.a[5] | tojson(indent=2) }}|{{ [1, [2]] | tojson(indent=2) }}", ctx.clone()).unwrap();
        assert_eq!(indented, "{}|[\n  1,\n  [\n    2\n  ]\n]");
        assert!(env.render_str("{{ v | tojson(sort_keys=true) }}", ctx).is_err(), "unsupported options are errors, not silent differences");
    }
}
