//! Target allowlists: which endpoints (`host:port`) or Envoy clusters a pick may name. The
//! filter refuses to route anywhere else, and the state service refuses to register (or
//! adopt from another replica) a worker anywhere else: one matcher for both.

/// Whether `target` matches `pattern`: exact, or with `*` standing for any run of characters
/// (`10.1.0.*:8000`, `vllm_*`).
pub fn matches(pattern: &str, target: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or_default();
    let Some(mut rest) = target.strip_prefix(first) else { return false };
    let tail: Vec<&str> = parts.collect();
    let Some((last, middle)) = tail.split_last() else { return rest.is_empty() };
    for part in middle {
        match rest.find(part) {
            Some(i) => rest = rest.get(i + part.len()..).unwrap_or_default(),
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

/// Whether `target` is allowed by `patterns` (an empty list allows anything).
pub fn allowed(patterns: &[String], target: &str) -> bool {
    patterns.is_empty() || patterns.iter().any(|p| matches(p, target))
}

/// A usable pattern: non-empty, printable, no spaces.
pub fn valid_pattern(pattern: &str) -> bool {
    !pattern.is_empty() && pattern.bytes().all(|b| b.is_ascii_graphic())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_and_wildcard_patterns() {
        assert!(matches("10.1.0.*:8000", "10.1.0.5:8000") && !matches("10.1.0.*:8000", "10.1.0.5:9000"));
        assert!(matches("vllm_*", "vllm_gpu_0") && !matches("vllm_*", "x_vllm_1"));
        assert!(matches("exact:1", "exact:1") && !matches("exact:1", "exact:12"));
        assert!(matches("*", "x") && matches("a*b*c", "aXbYc") && !matches("a*b*c", "aXbY"));
        assert!(allowed(&[], "anything:1") && !allowed(&["a".into()], "b"));
        assert!(!valid_pattern("") && !valid_pattern("a b") && valid_pattern("10.*:80"));
    }
}
