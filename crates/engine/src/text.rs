//! Deterministic filler text: the engine's "model output".

const WORDS: [&str; 32] = [
    " the",
    " queue",
    " drains",
    " when",
    " arrivals",
    " stay",
    " below",
    " throughput",
    " and",
    " every",
    " wait",
    " is",
    " bounded",
    " by",
    " a",
    " budget",
    " so",
    " that",
    " slow",
    " requests",
    " fail",
    " fast",
    " instead",
    " of",
    " piling",
    " up",
    " behind",
    " one",
    " busy",
    " replica",
    " today",
    ".",
];

/// The text of output token `index` of a sequence seeded by `seed`: one word, one token.
pub(crate) fn token(seed: u64, index: u32) -> &'static str {
    let i = seed
        .wrapping_mul(31)
        .wrapping_add(u64::from(index).wrapping_mul(7))
        % WORDS.len() as u64;
    WORDS[i as usize]
}

#[cfg(test)]
mod tests {
    #[test]
    fn deterministic() {
        assert_eq!(super::token(3, 9), super::token(3, 9));
    }
}
