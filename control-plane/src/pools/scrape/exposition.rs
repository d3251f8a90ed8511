//! The Prometheus exposition format's sample lines (`name{labels} value [timestamp]`), read
//! leniently: comments, malformed lines and other metrics are skipped, so an engine adding
//! metrics changes nothing. Shared by the engines that speak Prometheus (vLLM, SGLang).

use switchyard_protocol::worker::MAX_KV_BLOCKS;

/// A gauge value as a count: non-negative, finite, saturating.
pub(super) fn count(value: f64) -> u32 {
    if value.is_finite() && value > 0.0 {
        value.round().min(f64::from(u32::MAX)) as u32
    } else {
        0
    }
}

/// A KV capacity in blocks from a gauge: `None` unless it is a whole number of blocks an
/// engine can have (1 to [`MAX_KV_BLOCKS`]); a float's `1e30` is refused here, not clamped
/// into a plausible-looking count.
pub(super) fn capacity_blocks(value: f64) -> Option<u64> {
    let blocks = value.floor();
    (blocks.is_finite() && blocks >= 1.0 && blocks <= MAX_KV_BLOCKS as f64).then_some(blocks as u64)
}

#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Sum {
    total: f64,
    series: u32,
}

impl Sum {
    pub(super) fn add(&mut self, value: f64) {
        if value.is_finite() {
            self.total += value;
            self.series += 1;
        }
    }

    pub(super) fn total(self) -> Option<f64> {
        (self.series > 0).then_some(self.total)
    }

    pub(super) fn mean(self) -> Option<f64> {
        self.total().map(|t| t / f64::from(self.series))
    }
}

/// One sample line.
pub(super) struct Sample<'a> {
    pub(super) name: &'a str,
    labels: &'a str,
    pub(super) value: f64,
}

impl<'a> Sample<'a> {
    pub(super) fn parse(line: &'a str) -> Option<Sample<'a>> {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            return None;
        }
        let (name, labels, rest) = match line.find('{') {
            Some(open) => {
                let close = open + closing_brace(line.get(open..)?)?;
                (
                    line.get(..open)?,
                    line.get(open + 1..close)?,
                    line.get(close + 1..)?,
                )
            }
            None => {
                let (name, rest) = line.split_once(char::is_whitespace)?;
                (name, "", rest)
            }
        };
        let value = rest.split_whitespace().next()?.parse().ok()?;
        Some(Sample {
            name: name.trim(),
            labels,
            value,
        })
    }

    /// The value of label `key` (escapes are not undone: the labels read here are numbers).
    pub(super) fn label(&self, key: &str) -> Option<&'a str> {
        let mut rest = self.labels;
        while !rest.is_empty() {
            let (k, after) = rest.split_once('=')?;
            let after = after.strip_prefix('"')?;
            let end = closing_quote(after)?;
            let value = after.get(..end)?;
            if k.trim() == key {
                return Some(value);
            }
            rest = after.get(end + 1..)?.trim_start_matches(',').trim_start();
        }
        None
    }
}

/// Offset of the `}` closing the label set that starts `text` (quotes respected).
fn closing_brace(text: &str) -> Option<usize> {
    let mut in_quotes = false;
    let mut escaped = false;
    for (i, c) in text.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if in_quotes => escaped = true,
            '"' => in_quotes = !in_quotes,
            '}' if !in_quotes => return Some(i),
            _ => {}
        }
    }
    None
}

/// Offset of the `"` ending a label value (after its opening quote).
fn closing_quote(text: &str) -> Option<usize> {
    let mut escaped = false;
    for (i, c) in text.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            '"' => return Some(i),
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoted_braces_and_escapes_in_labels_do_not_confuse_the_reader() {
        let text = r#"vllm:cache_config_info{a="x}\"y",num_gpu_blocks="7"} 1"#;
        let sample = Sample::parse(text).unwrap();
        assert_eq!(sample.label("num_gpu_blocks"), Some("7"));
        assert_eq!(sample.label("a"), Some(r#"x}\"y"#));
        assert_eq!(sample.value, 1.0);
    }
}
