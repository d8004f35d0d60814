//! `tojson` as transformers defines it for chat templates:
//! `json.dumps(x, ensure_ascii=False)` — `", "` and `": "` separators, keys in insertion
//! order, non-ASCII kept, floats in Python `repr` style. (minijinja's own `tojson` is
//! compact and HTML-escapes, which would change the prompt's tokens.)

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Error, ErrorKind, Value};

pub fn tojson(v: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent").ok().flatten();
    let _: Option<bool> = kwargs.get("ensure_ascii").ok().flatten();
    let mut out = String::new();
    write(&v, &mut out, indent, 0)?;
    Ok(Value::from_safe_string(out))
}

fn newline(out: &mut String, indent: Option<usize>, depth: usize) {
    if let Some(n) = indent {
        out.push('\n');
        out.push_str(&" ".repeat(n * depth));
    }
}

fn write(v: &Value, out: &mut String, indent: Option<usize>, depth: usize) -> Result<(), Error> {
    let item_sep = if indent.is_some() { "," } else { ", " };
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => out.push_str(&number(v)),
        ValueKind::String => string(v.as_str().unwrap_or_default(), out),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, indent, depth + 1);
                write(item, out, indent, depth + 1)?;
            }
            if !items.is_empty() {
                newline(out, indent, depth);
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
                newline(out, indent, depth + 1);
                string(&k.to_string(), out);
                out.push_str(": ");
                write(&v.get_item(k)?, out, indent, depth + 1)?;
            }
            if !keys.is_empty() {
                newline(out, indent, depth);
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
        Ok(f) if f.is_nan() => "NaN".into(),
        Ok(f) if f.is_infinite() => if f > 0.0 { "Infinity".into() } else { "-Infinity".into() },
        Ok(f) if f.fract() == 0.0 && f.abs() < 1e16 => format!("{f:.1}"),
        Ok(f) => {
            let s = format!("{f:?}");
            // Rust prints 1e20 as "1e20"; Python as "1e+20".
            match s.split_once('e') {
                Some((m, e)) if !e.starts_with('-') => format!("{m}e+{e}"),
                _ => s,
            }
        }
        Err(_) => v.to_string(),
    }
}

fn string(s: &str, out: &mut String) {
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
            c => out.push(c),
        }
    }
    out.push('"');
}
