//! Where a pipeline's transfers go, decided once for the whole order before anything runs.
//!
//! Chunk `c` (1-indexed, of `C`) runs on rank `(c - 1) % world`. Its forward first receives its
//! input from chunk `c - 1`'s rank and last sends its output to chunk `c + 1`'s; its backward
//! first receives its output's grad from chunk `c + 1`'s rank and last sends its input grad
//! back. Weight-grad steps (`w(c)`) transfer nothing. A send does not complete before the peer
//! posts the matching receive (NCCL's may not), so where two ranks would each send before
//! receiving (1F1B's steady state: one sends the next activation while the other sends a grad
//! back) both would wait forever. A send may therefore be held back and go out in one group
//! with a later step's receive (`Communicator::send_recv_group`): both are posted at once and
//! neither waits for the other. The rank's sends in between are held back with it, so that
//! messages between two ranks keep their order.
//!
//! The plan simulates every rank at once, each waiting for its current group to complete (a
//! transfer completes once both ends are posted). Where no rank can move, it takes a stuck
//! rank's send that its peer has not met and moves it into the group of the rank's next
//! receive, then simulates again. It prefers a send with no weight-grad step before that
//! receive (holding it past one would keep the peer waiting for it), then one that holds back
//! fewer other sends, then the lowest rank; moving a send past a receive can lead into a dead
//! end, so when sparing weight-grad steps does, the search runs again without. When no stuck
//! rank has a send left to move, the order is refused. (An order refused so might still run
//! with receives posted earlier, as Megatron-LM posts them; every schedule of
//! [`super::PipelineSchedule`] runs.) Messages between two ranks arrive in the order they are
//! sent, so an order in which a rank would receive them in another order is refused too.
//! Every rank computes the plan of the whole order and so gets the same.

use crate::graphed::Schedule;
use crate::{DistError, OrderEntry, PipelineTransfer, Result};

/// What a transfer carries, the same on both ends: chunk `chunk`'s output (an activation) or
/// input grad for `microbatch`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Tag {
    activation: bool,
    chunk: usize,
    microbatch: usize,
}

/// One end of a transfer, as the rank that posts it sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Transfer {
    sends: bool,
    peer: usize,
    tag: Tag,
}

impl Transfer {
    fn report(self, rank: usize) -> PipelineTransfer {
        let Transfer { sends, peer, tag: Tag { activation, chunk, microbatch } } = self;
        PipelineTransfer { rank, sends, peer, activation, chunk, microbatch }
    }
}

/// One entry of a rank's order: what it receives first and sends last.
#[derive(Clone, Copy, Debug)]
struct Step {
    receive: Option<Transfer>,
    send: Option<Transfer>,
    wgrad: bool,
}

/// One rank's part of a pipeline order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RankPlan {
    /// The chunks of the whole order.
    pub(crate) chunks: usize,
    /// The rank's entries of the order, its chunks renumbered 1, 2, ... (chunk `rank + 1` is
    /// its chunk 1, chunk `rank + 1 + world` its chunk 2): what it captures with.
    pub(crate) local: Vec<OrderEntry>,
    /// Per entry of `local`: whether its send is held back, to go out in the group of a later
    /// entry's receive.
    pub(crate) hold: Vec<bool>,
    /// Per entry of `local`: how many held sends (the oldest first) go out in one group with
    /// its receive.
    pub(crate) release: Vec<usize>,
}

/// The number of chunks of `order` (its largest chunk) after checking that it is a valid
/// schedule whose chunks spread evenly over `world` ranks.
pub(crate) fn chunks_of(order: &[OrderEntry], world: usize) -> Result<usize> {
    let chunks = order.iter().map(|e| e.chunk()).max().unwrap_or(0);
    Schedule::new(Some(order), chunks.max(1), true)?;
    if world == 0 || chunks % world != 0 || (world == 1 && chunks != 1) {
        return Err(DistError::PipelineChunks { chunks, world }.into());
    }
    Ok(chunks)
}

/// Rank `rank`'s plan for `order` on `world` ranks (see the module doc), or why the order
/// cannot run across ranks.
pub(crate) fn plan(order: &[OrderEntry], world: usize, rank: usize) -> Result<RankPlan> {
    let chunks = chunks_of(order, world)?;
    if rank >= world {
        return Err(DistError::World { op: "stage_order", rank, world }.into());
    }
    let steps = steps(order, chunks, world);
    check_pair_orders(&steps)?;
    // Sparing weight-grad steps can lead the search into a dead end: then without.
    let places = place_sends(&steps, true).or_else(|_| place_sends(&steps, false))?;
    let local = order
        .iter()
        .filter(|e| (e.chunk() - 1) % world == rank)
        .map(|e| {
            let c = (e.chunk() - 1) / world + 1;
            match e {
                OrderEntry::Forward(_) => OrderEntry::Forward(c),
                OrderEntry::Backward(_) => OrderEntry::Backward(c),
                OrderEntry::Wgrad(_) => OrderEntry::Wgrad(c),
            }
        })
        .collect();
    let mine = &places[rank];
    let hold = mine.iter().map(Option::is_some).collect();
    let release = (0..mine.len()).map(|j| mine.iter().filter(|p| **p == Some(j)).count()).collect();
    Ok(RankPlan { chunks, local, hold, release })
}

/// Every rank's steps, in its order.
fn steps(order: &[OrderEntry], chunks: usize, world: usize) -> Vec<Vec<Step>> {
    let rank_of = |c: usize| (c - 1) % world;
    // Per chunk: forwards and backwards so far (first in, first out, as the schedule runs them).
    let (mut fwd, mut bwd) = (vec![0usize; chunks + 1], vec![0usize; chunks + 1]);
    let mut out = vec![Vec::new(); world];
    for &e in order {
        let c = e.chunk();
        let me = rank_of(c);
        let end = |sends: bool, other: usize, activation: bool, chunk: usize, microbatch: usize| Transfer {
            sends,
            peer: rank_of(other),
            tag: Tag { activation, chunk, microbatch },
        };
        let step = match e {
            OrderEntry::Forward(_) => {
                let m = fwd[c];
                fwd[c] += 1;
                Step {
                    receive: (c > 1).then(|| end(false, c - 1, true, c - 1, m)),
                    send: (c < chunks).then(|| end(true, c + 1, true, c, m)),
                    wgrad: false,
                }
            }
            OrderEntry::Backward(_) => {
                let m = bwd[c];
                bwd[c] += 1;
                Step {
                    receive: (c < chunks).then(|| end(false, c + 1, false, c + 1, m)),
                    send: (c > 1).then(|| end(true, c - 1, false, c, m)),
                    wgrad: false,
                }
            }
            OrderEntry::Wgrad(_) => Step { receive: None, send: None, wgrad: true },
        };
        out[me].push(step);
    }
    out
}

/// Messages between two ranks arrive in the order they are sent: the n-th send from rank a to
/// rank b must carry what b's n-th receive from a expects.
fn check_pair_orders(steps: &[Vec<Step>]) -> Result<()> {
    let world = steps.len();
    for a in 0..world {
        for b in (0..world).filter(|&b| b != a) {
            let sent = steps[a].iter().filter_map(|s| s.send).filter(|t| t.peer == b);
            let received = steps[b].iter().filter_map(|s| s.receive).filter(|t| t.peer == a);
            for (s, r) in sent.zip(received) {
                if s.tag != r.tag {
                    return Err(DistError::PipelineTransferOrder { sent: s.report(a), received: r.report(b) }.into());
                }
            }
        }
    }
    Ok(())
}

/// Where each step's send goes out, per rank and step: `None` at the end of its own step (or
/// no send), `Some(j)` in one group with step `j`'s receive, at the start of step `j`. Places
/// never go backwards in a rank's order, so its messages keep their order.
type Places = Vec<Vec<Option<usize>>>;

/// A group of transfers a rank posts at once and waits for, with the step each send is of.
struct Group {
    transfers: Vec<(Transfer, Option<usize>)>,
    /// Where it lies in the rank's order: (step, 0) for a step's first group, (step, 1) for
    /// its last.
    at: (usize, usize),
}

/// The groups a rank posts, in order, given where its sends go out.
fn groups(steps: &[Step], places: &[Option<usize>]) -> Vec<Group> {
    let mut out = Vec::new();
    for (j, s) in steps.iter().enumerate() {
        let held = (0..j).filter(|&i| places[i] == Some(j)).filter_map(|i| Some((steps[i].send?, Some(i))));
        let first: Vec<_> = held.chain(s.receive.map(|r| (r, None))).collect();
        if !first.is_empty() {
            out.push(Group { transfers: first, at: (j, 0) });
        }
        if let (Some(t), None) = (s.send, places[j]) {
            out.push(Group { transfers: vec![(t, Some(j))], at: (j, 1) });
        }
    }
    out
}

/// Where the sends go out: at the end of their steps unless that deadlocks (see the module
/// doc). With `spare_wgrad`, a send that would wait for a weight-grad step is moved last.
fn place_sends(steps: &[Vec<Step>], spare_wgrad: bool) -> Result<Places> {
    let mut places: Places = steps.iter().map(|s| vec![None; s.len()]).collect();
    loop {
        let all: Vec<Vec<Group>> = steps.iter().zip(&places).map(|(s, p)| groups(s, p)).collect();
        let Err(stuck) = simulate(&all) else { return Ok(places) };
        // For each stuck rank whose group holds a send its peer has not met: that send (and
        // the rank's later sends before it) into the group of the next receive, cheapest
        // first (no weight-grad step to wait for, fewer sends moved), then by rank.
        let candidate = stuck
            .iter()
            .filter_map(|&(rank, g, k)| {
                let group = &all[rank][g];
                let (t, i) = group.transfers[k];
                let i = i.filter(|_| t.sends)?;
                let s = &steps[rank];
                let j = (group.at.0 + 1..s.len()).find(|&j| s[j].receive.is_some())?;
                let past_wgrad = s[group.at.0 + 1..j].iter().any(|s| s.wgrad);
                let moved: Vec<usize> = (i..j).filter(|&m| s[m].send.is_some() && places[rank][m] < Some(j)).collect();
                Some(((past_wgrad && spare_wgrad, moved.len(), rank), j, moved))
            })
            .min();
        match candidate {
            Some(((_, _, rank), j, moved)) => {
                for m in moved {
                    places[rank][m] = Some(j);
                }
            }
            None => {
                let report = stuck.iter().map(|&(rank, g, k)| all[rank][g].transfers[k].0.report(rank));
                return Err(DistError::PipelineDeadlock { stuck: report.collect() }.into());
            }
        }
    }
}

/// Runs every rank's groups: a transfer completes once both its ends are posted (its rank's
/// current group holds it), a rank moves on once its current group completed. `Err` holds
/// (rank, current group, first transfer not met) of every rank left waiting when none can
/// move.
fn simulate(groups: &[Vec<Group>]) -> std::result::Result<(), Vec<(usize, usize, usize)>> {
    let world = groups.len();
    // Where each end lies, (rank, group, index), and its other end, matched in order per
    // (sender, receiver) pair.
    let mut other = vec![Vec::new(); world];
    let mut sends: Vec<Vec<Vec<(usize, usize)>>> = vec![vec![Vec::new(); world]; world];
    let mut receives: Vec<Vec<Vec<(usize, usize)>>> = vec![vec![Vec::new(); world]; world];
    for (r, gs) in groups.iter().enumerate() {
        for (g, group) in gs.iter().enumerate() {
            other[r].push(vec![(0, 0, 0); group.transfers.len()]);
            for (k, (t, _)) in group.transfers.iter().enumerate() {
                let list = if t.sends { &mut sends[r][t.peer] } else { &mut receives[t.peer][r] };
                list.push((g, k));
            }
        }
    }
    for a in 0..world {
        for b in 0..world {
            for (&(gs, ks), &(gr, kr)) in sends[a][b].iter().zip(&receives[a][b]) {
                other[a][gs][ks] = (b, gr, kr);
                other[b][gr][kr] = (a, gs, ks);
            }
        }
    }
    let mut done: Vec<Vec<Vec<bool>>> =
        groups.iter().map(|gs| gs.iter().map(|g| vec![false; g.transfers.len()]).collect()).collect();
    let mut at = vec![0usize; world];
    loop {
        let mut moved = false;
        for r in 0..world {
            let Some(g) = groups[r].get(at[r]) else { continue };
            for k in 0..g.transfers.len() {
                let (p, gp, kp) = other[r][at[r]][k];
                if !done[r][at[r]][k] && at[p] == gp {
                    done[r][at[r]][k] = true;
                    done[p][gp][kp] = true;
                    moved = true;
                }
            }
        }
        for r in 0..world {
            while at[r] < groups[r].len() && done[r][at[r]].iter().all(|d| *d) {
                at[r] += 1;
                moved = true;
            }
        }
        if (0..world).all(|r| at[r] == groups[r].len()) {
            return Ok(());
        }
        if !moved {
            let stuck = (0..world).filter(|&r| at[r] < groups[r].len());
            let first_open = |r: usize| done[r][at[r]].iter().position(|d| !d).unwrap_or(0);
            return Err(stuck.map(|r| (r, at[r], first_open(r))).collect());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn defer_of(order: &[i32], world: usize) -> Result<Vec<Vec<bool>>> {
        let order = OrderEntry::from_ints(order);
        (0..world).map(|r| plan(&order, world, r).map(|p| p.hold)).collect()
    }

    #[test]
    fn gpipe_needs_no_group() {
        let d = defer_of(&[1, 1, 2, 2, -2, -2, -1, -1], 2).unwrap();
        assert!(d.iter().flatten().all(|d| !d), "{d:?}");
    }

    #[test]
    fn one_f_one_b_groups_one_side() {
        // Rank 0: F F B F B B; rank 1: F B F B F B (3 microbatches).
        let d = defer_of(&[1, 1, 2, -2, -1, 1, 2, -2, -1, 2, -2, -1], 2).unwrap();
        // Rank 0 (lower) defers the sends of its 2nd and 3rd forwards into the backwards' groups.
        assert_eq!(d[0], [false, true, false, true, false, false]);
        assert!(d[1].iter().all(|d| !d), "{d:?}");
    }

    #[test]
    fn a_send_waits_past_no_wgrad_when_the_peer_can_group() {
        use OrderEntry::{Backward as B, Forward as F, Wgrad as W};
        // Rank 1 runs each microbatch's weight grads between its backward and its next
        // forward: rank 0 groups instead, so rank 1's grads go out at once.
        let order = [F(1), F(1), F(2), B(2), W(2), B(1), W(1), F(2), B(2), W(2), B(1), W(1)];
        let p1 = plan(&order, 2, 1).unwrap();
        assert!(p1.hold.iter().all(|d| !d));
        let p0 = plan(&order, 2, 0).unwrap();
        assert_eq!(p0.hold, [false, true, false, false, false, false]);
        assert_eq!(p0.release, [0, 0, 1, 0, 0, 0]);
    }

    #[test]
    fn grouping_helps_sends_not_receives() {
        // Chunk 2's first backward before chunk 1's second forward: each rank would send first,
        // a group lets them meet.
        assert!(defer_of(&[1, 1, 2, -2, 2, -2, -1, -1], 2).is_ok());
        // Chunk 1 waits for its first grad before it sends its second activation, which chunk
        // 2 waits for before it sends that grad: both wait to receive, nothing helps.
        let e = defer_of(&[1, -1, 1, -1, 2, 2, -2, -2], 2).unwrap_err();
        let crate::Error::Dist(DistError::PipelineDeadlock { stuck }) = e else { panic!("{e}") };
        assert_eq!(stuck.len(), 2);
        assert!(stuck.iter().all(|t| !t.sends), "{stuck:?}");
        let e = defer_of(&[1, 2, -2, -1, 1, 2, -2, -1], 3).unwrap_err();
        assert!(matches!(e, crate::Error::Dist(DistError::PipelineChunks { chunks: 2, world: 3 })), "{e}");
    }

    #[test]
    fn pairs_must_agree_on_the_order_of_their_messages() {
        // Rank 0 runs chunks 1 and 3, rank 1 chunks 2 and 4. Rank 0 sends chunk 3's output
        // before chunk 1's second, rank 1 receives chunk 1's second first.
        let order = [1, 2, 3, 4, -4, -3, -2, -1, 1, 3, 2, 4, -4, -3, -2, -1];
        let ok = defer_of(&order, 2);
        assert!(ok.is_ok(), "{ok:?}");
        let bad = [1, 2, 3, 1, 2, 4, 3, 4, -4, -4, -3, -3, -2, -2, -1, -1];
        let e = defer_of(&bad, 2).unwrap_err();
        assert!(matches!(e, crate::Error::Dist(DistError::PipelineTransferOrder { .. })), "{e}");
    }
}
