//! Reading values out of a Prometheus text exposition (what vLLM's and Spillway's `/metrics` serve).

/// The values of every series named `name` (any labels), in order. The value is the first field
/// after the labels (which may hold spaces inside quotes); an optional timestamp after it is ignored.
pub fn values<'a>(text: &'a str, name: &'a str) -> impl Iterator<Item = f64> + 'a {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(move |l| l.split(['{', ' ']).next() == Some(name))
        .filter_map(move |line| {
            let rest = line.rfind('}').map_or(&line[name.len()..], |i| &line[i + 1..]);
            rest.split_whitespace().next()?.parse::<f64>().ok()
        })
}

/// The sum over every series named `name`; `None` when the name is absent.
pub fn sum(text: &str, name: &str) -> Option<f64> {
    values(text, name).fold(None, |acc, v| Some(acc.unwrap_or(0.0) + v))
}

/// The largest value of the series named `name`; `None` when the name is absent.
pub fn max(text: &str, name: &str) -> Option<f64> {
    values(text, name).fold(None, |acc: Option<f64>, v| Some(acc.map_or(v, |a| a.max(v))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_are_found_by_exact_name_whatever_their_labels() {
        let text = "# HELP vllm:num_requests_waiting x\n# TYPE vllm:num_requests_waiting gauge\n\
            vllm:num_requests_waiting{engine=\"0\",model_name=\"a b\"} 3.0\n\
            vllm:num_requests_waiting{engine=\"1\",model_name=\"a b\"} 2 1700000000000\n\
            vllm:num_requests_waiting_total 99\n\
            up 1\n";
        assert_eq!(sum(text, "vllm:num_requests_waiting"), Some(5.0));
        assert_eq!(max(text, "vllm:num_requests_waiting"), Some(3.0));
        assert_eq!(sum(text, "up"), Some(1.0));
        assert_eq!(sum(text, "absent"), None);
    }
}
