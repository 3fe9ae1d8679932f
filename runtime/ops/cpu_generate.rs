//! The CPU reference of a generation step's bookkeeping: record each sequence's token, stop
//! the sequences that reached their end token or their length, and say whether any is left.
//! Included in [`crate::ops::cpu`].

/// The bookkeeping of a batch being generated, as [`crate::ops::Generation`] holds it on the
/// device: `tokens` `[batch, max_new]` row-major, one `counts`, `done` and `limits` entry per
/// sequence, `stop = [end token (-1 for none), pad token]`, and the steps taken.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GenerationState {
    /// The recorded tokens, `[batch, max_new]`.
    pub tokens: Vec<i32>,
    /// Tokens each sequence has produced (its end token included).
    pub counts: Vec<i32>,
    /// 1 once a sequence has stopped.
    pub done: Vec<i32>,
    /// The most tokens each sequence may produce.
    pub limits: Vec<i32>,
    /// The end token (-1: none) and the pad token a stopped sequence records.
    pub stop: [i32; 2],
    /// Steps taken: the column the next step records in.
    pub step: i32,
    /// Columns of `tokens`.
    pub max_new: usize,
}

/// One step: for each sequence `b`, records at column `step` the sampled token while it is
/// active or the pad token once it is done; an active sequence counts its token and stops when
/// the token is the end token or its count reaches its limit. Returns the ids the next step
/// embeds (the recorded tokens), their positions (`lengths`), and whether a sequence is still
/// active and `step + 1 < max_new` (the loop condition); `step` advances by one.
pub fn generation_step(st: &mut GenerationState, sampled: &[i32], lengths: &[i32]) -> (Vec<f32>, Vec<f32>, bool) {
    let [end, pad] = st.stop;
    let s = st.step;
    let mut any = false;
    let mut next = Vec::with_capacity(sampled.len());
    for (b, &token) in sampled.iter().enumerate() {
        let was_done = st.done[b] != 0;
        let tok = if was_done { pad } else { token };
        if let Ok(col) = usize::try_from(s) {
            if col < st.max_new {
                st.tokens[b * st.max_new + col] = tok;
            }
        }
        if !was_done {
            st.counts[b] += 1;
            if tok == end || st.counts[b] >= st.limits[b] {
                st.done[b] = 1;
            } else {
                any = true;
            }
        }
        next.push(tok as f32);
    }
    st.step = s + 1;
    let active = any && usize::try_from(st.step).is_ok_and(|n| n < st.max_new);
    (next, lengths.iter().map(|&l| l as f32).collect(), active)
}
