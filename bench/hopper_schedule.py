#!/usr/bin/env python3
"""A schedule model of the Hopper attention backward's persistent grid (no GPU): how long the
causal backward takes, in iteration-times (one query tile of one key tile), for two orders of
the ordered dQ sum, against the ideal (the work spread evenly over the multiprocessors).

- "wave" (flash_hopper.cu's): a block walks its query tiles from the last; the first key tile
  adds first; items are taken longest first.
- "fa3" (FlashAttention-3's deterministic order): a block walks its query tiles from its
  diagonal; the last key tile adds first; items are taken shortest first.

Each block's products take one unit a tile; the dQ writer adds a tile's part in L units after
both the products and the turn before it are done; the products run at most `stages` tiles
ahead of the writer. docs/results/hopper-schedule-model-2026-12-07.txt is its output.

    python3 bench/hopper_schedule.py
"""
import heapq


def makespan(ntk, heads, sms, L, order, stages=2, chains=1):
    """`chains` (the "wave" order only): key tile j adds after key tile j - chains."""
    sched = list(range(ntk - 1, -1, -1)) if order == "fa3" else list(range(ntk))
    tiles = (lambda j: list(range(j, ntk))) if order == "fa3" else (lambda j: list(range(ntk - 1, j - 1, -1)))
    rank = (lambda j, m: m - j) if order == "fa3" else (lambda j, m: j // chains)
    before = (lambda j: j + 1) if order == "fa3" else (lambda j: j - chains)
    done, free, end = {}, [0.0] * sms, 0.0
    heapq.heapify(free)
    for j in sched:
        for h in range(heads):
            t = heapq.heappop(free)
            w, wt = [], t
            for i, m in enumerate(tiles(j)):
                if i >= stages:
                    t = max(t, w[i - stages])
                t += 1.0
                start = max(t, wt)
                if rank(j, m) > 0:
                    start = max(start, done[(before(j), h, m)])
                wt = start + L
                w.append(wt)
                done[(j, h, m)] = wt
            heapq.heappush(free, max(t, wt))
            end = max(end, t, wt)
    return end


def main():
    print("causal; iteration-times; 132 multiprocessors; L = the writer's time a tile")
    for ntk, heads, name in ((32, 8, "1 x 4096 x 8 heads (128-row tiles)"), (8, 32, "4 x 1024 x 8 heads"), (2, 128, "16 x 256 x 8 heads")):
        ideal = heads * sum(ntk - j for j in range(ntk)) / 132
        row = "  ".join(f"{o} L={L}: {makespan(ntk, heads, 132, L, o):.1f}" for o in ("wave", "fa3") for L in (0.3, 1.0))
        print(f"{name}: ideal {ideal:.1f}  {row}")
    print("the wave order with the dQ in 1, 2 and 4 chains (the runtime takes 2 within two waves; L = 0.6 fits the measured 168 against 151 µs)")
    for ntk, heads, name in ((32, 8, "1 x 4096 x 8 heads"), (8, 32, "4 x 1024 x 8 heads"), (32, 64, "4 x 4096 x 16 heads")):
        ideal = heads * sum(ntk - j for j in range(ntk)) / 132
        row = "  ".join(f"chains {c} L={L}: {makespan(ntk, heads, 132, L, 'wave', chains=c):.1f}" for L in (0.3, 0.6, 1.0) for c in (1, 2, 4))
        print(f"{name}: ideal {ideal:.1f}  {row}")


if __name__ == "__main__":
    main()
