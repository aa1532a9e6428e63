//! A YAML or schema error in the words of the file's author: the field's path once (the caller
//! prints it), a suggestion for a misspelt key, and the parser's jargon about indentation said
//! plainly, pointing at the line that is out of step.

/// The message for an error the parser or the schema found in `text` at `path`.
pub(super) fn plain(path: &str, e: &serde_yaml_ng::Error, text: &str) -> String {
    let mut message = e.to_string();
    // serde_yaml_ng starts its message with the path of the map it was in: the caller prints
    // the field's own path already, and twice reads as two errors.
    if let Some((head, rest)) = message.split_once(": ")
        && is_path(head)
        && (path == head || path.starts_with(&format!("{head}.")) || path.starts_with(&format!("{head}[")))
    {
        message = rest.to_owned();
    }
    if let Some((unknown, hint)) = misspelt(&message) {
        // Right after the unknown key, before the list of every key it could have been.
        let at = format!("unknown field `{unknown}`");
        message = message.replacen(&at, &format!("{at} (did you mean `{hint}`?)"), 1);
    }
    let line = e.location().map(|l| l.line());
    if let Some(hint) = missing_key_elsewhere(&message, line, text) {
        message = format!("{message}; {hint}");
    }
    if let Some(hint) = jargon(&message, line, text) {
        message = format!("{hint} ({message})");
    }
    message
}

/// `routes[0].classes`: what serde_yaml_ng writes before its message.
fn is_path(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "_.[]".contains(c))
}

/// The unknown field and the expected one closest to it, when it is close enough to be a slip.
fn misspelt(message: &str) -> Option<(String, String)> {
    let rest = message.strip_prefix("unknown field `")?;
    let (unknown, rest) = rest.split_once('`')?;
    let expected = rest.split_once("expected one of ")?.1;
    let candidates = expected
        .split(", ")
        .filter_map(|c| c.trim().strip_prefix('`')?.split('`').next());
    candidates
        .map(|c| (strsim::damerau_levenshtein(unknown, c), c))
        .filter(|(d, c)| *d <= 2.max(c.len() / 4) && *d < c.len())
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| (unknown.to_owned(), c.to_owned()))
}

/// For "missing field `x`" where the file does have an `x:` on another line: the usual cause is
/// that line's indentation, which made it belong to something else.
fn missing_key_elsewhere(message: &str, line: Option<usize>, text: &str) -> Option<String> {
    let key = message.strip_prefix("missing field `")?.split('`').next()?;
    let lines: Vec<&str> = text.lines().collect();
    let at = line?.checked_sub(1)?;
    // The item's keys start where the reported line's first key does (after any "- ").
    let item = lines.get(at)?;
    let item_indent = item.len() - item.trim_start_matches([' ', '-']).len();
    let (n, found) = lines.iter().enumerate().skip(at).find(|(_, l)| {
        let t = l.trim_start_matches([' ', '-']);
        t.strip_prefix(key)
            .is_some_and(|r| r.trim_start().starts_with(':'))
    })?;
    let indent = found.len() - found.trim_start_matches([' ', '-']).len();
    (indent != item_indent).then(|| {
        format!(
            "`{key}` is on line {} indented {indent} spaces, where this item's keys (line {}) are \
             indented {item_indent}: line it up with them",
            n + 1,
            at + 1
        )
    })
}

/// The parser's words for an indentation or a tab, said plainly.
fn jargon(message: &str, line: Option<usize>, text: &str) -> Option<String> {
    // A tab in a line's indentation (a tab in a comment or a value is legal YAML).
    let indented_by_tab = |l: &str| l.chars().take_while(|c| c.is_whitespace()).any(|c| c == '\t');
    let at = |n: usize| text.lines().nth(n.checked_sub(1)?);
    let tab = match line {
        Some(n) => at(n).is_some_and(indented_by_tab).then_some(n),
        None => text.lines().position(indented_by_tab).map(|i| i + 1),
    };
    if let Some(n) = tab {
        return Some(format!("a tab on line {n}: YAML indents with spaces only"));
    }
    let plain = if message.contains("mapping values are not allowed in this context") {
        "a `key: value` where none can stand: this line is indented differently from the keys \
         beside it, or a value holding \": \" needs quotes"
    } else if message.contains("did not find expected key") {
        "this line's indentation does not match the keys above it (or a quote is not closed)"
    } else if message.contains("did not find expected '-' indicator") {
        "a list item that does not line up with the items above it"
    } else if message.contains("block sequence entries are not allowed in this context") {
        "a list item (`- `) where a value on the same line was expected: check its indentation"
    } else {
        return None;
    };
    Some(plain.to_owned())
}

#[cfg(test)]
mod tests {
    use crate::Config;

    const HEAD: &str =
        "listen: 127.0.0.1:0\nroutes:\n  - model: chat\n    replicas: [http://127.0.0.1:8000]\n";

    fn error(yaml: &str) -> String {
        Config::from_yaml(yaml).unwrap_err().to_string()
    }

    #[test]
    fn the_path_is_said_once() {
        let e = error(&format!(
            "{HEAD}    classes:\n      - name: interactive\n        concurrency: -3\n"
        ));
        assert!(
            e.starts_with("routes[0].classes[0].concurrency: use a number"),
            "{e}"
        );
        assert_eq!(e.matches("routes[0]").count(), 1, "{e}");
    }

    #[test]
    fn a_misspelt_key_gets_a_suggestion() {
        let e = error(&format!(
            "{HEAD}    clases:\n      - name: interactive\n        concurrency: 3\n"
        ));
        assert!(e.contains("unknown field `clases`"), "{e}");
        assert!(
            e.contains("unknown field `clases` (did you mean `classes`?), expected one of"),
            "{e}"
        );
        // Nothing close: no guess.
        let e = error(&format!("{HEAD}    zzzzzzzz: 1\n"));
        assert!(!e.contains("did you mean"), "{e}");
    }

    #[test]
    fn a_key_out_of_line_is_pointed_at() {
        let e = error(&format!(
            "{HEAD}    classes:\n      - name: interactive\n       concurrency: 3\n"
        ));
        assert!(
            e.contains(
                "`concurrency` is on line 7 indented 7 spaces, where this item's keys (line 6) are indented 8"
            ),
            "{e}"
        );
    }

    #[test]
    fn a_tab_is_named() {
        let e = error("listen: 127.0.0.1:0\nroutes:\n\t- model: chat\n");
        assert!(
            e.contains("a tab on line 3: YAML indents with spaces only"),
            "{e}"
        );
    }
}
