use super::*;

fn limits(max_num_seqs: usize, budget: u32) -> SchedulerLimits {
    SchedulerLimits {
        max_num_seqs,
        max_num_batched_tokens: budget,
        block_size: 16,
        enable_prefix_caching: false,
    }
}

fn spec(prompt_len: u32, target: u32) -> SeqSpec {
    SeqSpec {
        prompt_len,
        prompt_hashes: Vec::new(),
        target_tokens: target,
        reason_at_target: FinishReason::Length,
        stall_at: None,
    }
}

/// Runs steps until idle (or `max_steps`), checking invariants after every step.
fn drain(s: &mut Scheduler, max_steps: usize) -> (Vec<RequestRecord>, Vec<StepShape>) {
    let mut now = Instant::now();
    let mut out = StepOutcome::default();
    let mut records = Vec::new();
    let mut shapes = Vec::new();
    for _ in 0..max_steps {
        if s.is_idle() {
            break;
        }
        let shape = s.schedule(now);
        assert!(s.num_running() <= s.limits.max_num_seqs);
        assert!(shape.tokens() <= s.limits.max_num_batched_tokens);
        shapes.push(shape);
        now += Duration::from_millis(1);
        out.clear();
        s.complete(now, &mut out);
        records.append(&mut out.finished);
    }
    (records, shapes)
}

#[test]
fn running_never_exceeds_max_num_seqs_and_all_finish() {
    let mut s = Scheduler::new(limits(4, 512), 1000);
    let now = Instant::now();
    let rxs: Vec<_> = (0..10).map(|i| s.add(i, spec(20, 5), now)).collect();
    let (records, _) = drain(&mut s, 1000);
    assert_eq!(records.len(), 10);
    assert!(
        records
            .iter()
            .all(|r| r.output_tokens == 5 && r.finish == FinishReason::Length)
    );
    for rx in rxs {
        assert_eq!(
            *rx.borrow(),
            Progress {
                tokens: 5,
                finish: Some(FinishReason::Length)
            }
        );
    }
    assert_eq!(s.kv.num_free(), 1000, "every block returned");
}

#[test]
fn long_prompts_are_prefilled_in_chunks_within_the_budget() {
    let mut s = Scheduler::new(limits(8, 64), 100);
    let _rx = s.add(1, spec(100, 2), Instant::now());
    let (records, shapes) = drain(&mut s, 100);
    assert_eq!(shapes[0].prefill_tokens, 64);
    assert_eq!(shapes[1].prefill_tokens, 36);
    assert_eq!(shapes[2].decode_seqs, 1);
    assert_eq!(records[0].output_tokens, 2);
    // The second chunk attends to the first: the pairs add up as if the prompt went in whole.
    assert_eq!(shapes[0].prefill_pairs, 64 * 65 / 2);
    assert_eq!(shapes[1].prefill_pairs, 36 * 64 + 36 * 37 / 2);
    assert_eq!(shapes[0].prefill_pairs + shapes[1].prefill_pairs, 100 * 101 / 2);
    assert_eq!(shapes[2].prefill_pairs, 0);
}

#[test]
fn decodes_are_scheduled_before_new_prefills() {
    let mut s = Scheduler::new(limits(8, 40), 100);
    let now = Instant::now();
    let _a = s.add(1, spec(30, 10), now);
    let (_, _) = (s.schedule(now), ());
    let mut out = StepOutcome::default();
    s.complete(now, &mut out);
    let _b = s.add(2, spec(100, 10), now);
    let shape = s.schedule(now);
    assert_eq!(shape.decode_seqs, 1, "the running sequence decodes first");
    assert_eq!(
        shape.prefill_tokens, 39,
        "the new prompt gets only what is left of the budget"
    );
}

#[test]
fn a_small_kv_cache_preempts_and_still_finishes_everything() {
    // 6 blocks of 16 tokens; four sequences that each grow to 40 tokens (3 blocks) cannot all fit.
    let mut s = Scheduler::new(limits(8, 512), 6);
    let now = Instant::now();
    let _rxs: Vec<_> = (0..4).map(|i| s.add(i, spec(16, 24), now)).collect();
    let (records, _) = drain(&mut s, 10_000);
    assert_eq!(records.len(), 4);
    assert!(records.iter().all(|r| r.output_tokens == 24));
    assert!(s.counters.preemptions > 0, "expected preemptions");
    assert!(records.iter().any(|r| r.preemptions > 0));
    assert_eq!(s.kv.num_free(), 6);
}

#[test]
fn prefix_cache_skips_recomputing_a_shared_prompt() {
    let mut l = limits(8, 512);
    l.enable_prefix_caching = true;
    let mut s = Scheduler::new(l, 100);
    let tokens: Vec<u32> = (0..64).collect();
    let hashes = crate::kv::block_hashes(&tokens, 16);
    let mk = || SeqSpec {
        prompt_len: 64,
        prompt_hashes: hashes.clone(),
        target_tokens: 1,
        reason_at_target: FinishReason::Length,
        stall_at: None,
    };
    let now = Instant::now();
    let _a = s.add(1, mk(), now);
    let (first, shapes_a) = drain(&mut s, 10);
    let _b = s.add(2, mk(), now);
    let (second, shapes_b) = drain(&mut s, 10);
    assert_eq!(shapes_a[0].prefill_tokens, 64);
    assert_eq!(first[0].prompt_tokens_cached, 0);
    // All four blocks hit, but the last token is recomputed to have something to sample.
    assert_eq!(shapes_b[0].prefill_tokens, 1);
    assert_eq!(second[0].prompt_tokens_cached, 63);
    assert_eq!(s.counters.prefix_queries, 128);
    assert_eq!(s.counters.prefix_hits, 63);
}

#[test]
fn an_aborted_sequence_frees_its_blocks_and_stops() {
    let mut s = Scheduler::new(limits(8, 512), 100);
    let now = Instant::now();
    let rx = s.add(1, spec(40, 1000), now);
    let mut out = StepOutcome::default();
    s.schedule(now);
    s.complete(now, &mut out);
    assert!(s.kv.num_free() < 100);
    drop(rx);
    out.clear();
    s.reap_aborted(now, &mut out);
    assert_eq!(out.finished[0].finish, FinishReason::Abort);
    assert_eq!(out.finished[0].output_tokens, 1);
    assert!(s.is_idle());
    assert_eq!(s.kv.num_free(), 100);
}

#[test]
fn a_stalled_sequence_holds_its_slot_without_producing() {
    let mut s = Scheduler::new(limits(1, 512), 100);
    let now = Instant::now();
    let mut sp = spec(10, 100);
    sp.stall_at = Some(3);
    let rx = s.add(1, sp, now);
    let _other = s.add(2, spec(10, 1), now);
    let mut out = StepOutcome::default();
    for _ in 0..50 {
        s.schedule(now);
        s.complete(now, &mut out);
    }
    assert_eq!(rx.borrow().tokens, 3);
    assert_eq!(s.num_running(), 1);
    assert_eq!(
        s.num_waiting(),
        1,
        "max_num_seqs = 1 is held by the stalled sequence"
    );
    assert!(s.schedule(now).is_empty());
}
