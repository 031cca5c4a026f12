#!/usr/bin/env python3
"""lift_decisions.py: where the estimate cap's lift stack changes a decision, in paired fleetsim decision logs
(EXPERIMENTS 124, tr32).

    fs -trace toolN.jsonl -replicas 8 -seeds N -kv-capacity 65536 -trace-time-scale R -parallel 1 \\
       -policy ramjet-precise -decisions S/dec.txt -records S            # and -policy ramjet-precise@capl=0 into C
    python3 bench/scripts/lift_decisions.py S C [S2 C2 ...]

Per pair (stack's log, cap's log): decisions; lifts (candidates with an own-block exact overlap more than one router
block past the estimate's credit that Pick read exactly, P1, in the stack's run; in brackets those the request went
to); would-lift (the same candidates with all four clauses passing, liftLMGF, in the cap's run); the first decision
the two runs send to different replicas (id, simulated s) and how many later decisions differ; then over all pairs
the lifts' time, in-flight count, pending prefill and resident context in KV capacities (before the decision), their
credit past the estimate, and how often the load clause passes before and after 90 s.
"""
import re, statistics as st, sys

HEAD = re.compile(r'id=(\d+) now=([\d.]+) .*? -> (-?\d+) (\S+)')


def parse(fn):
    decs = {}
    for line in open(fn):
        if not line.startswith('id='):
            continue
        head, _, rest = line.partition('|')
        m = HEAD.match(head)
        d = dict(now=float(m.group(2)), to=int(m.group(3)), c={})
        for tok in rest.split():
            i, _, f = tok.partition(':')
            d['c'][int(i)] = dict(re.findall(r'(lift)([-LMGF]{4})', f)) | {
                k: float(v) for k, v in re.findall(r'([A-Za-z]+0?)(-?\d[\d.]*)', f) if k != 'lift'}
        decs[int(m.group(1))] = d
    return decs


def past(c):  # own exact overlap more than one router block past the estimate's credit
    return 'x' in c and c.get('own') == 1 and c['x'] > c['est'] + 64


def main(args):
    print('| stack log | decisions | lifts (chosen) | cap would-lift | first differing (id, s) | later differing |')
    print('|---|---:|---:|---:|---|---|')
    lifts, early, late = [], [0, 0], [0, 0]
    for s, c in zip(args[::2], args[1::2]):
        a, b = parse(s + '/dec.txt'), parse(c + '/dec.txt')
        ids = sorted(a)
        fd = next((i for i in ids if i in b and a[i]['to'] != b[i]['to']), None)
        nd = sum(1 for i in ids if i in b and a[i]['to'] != b[i]['to'])
        mine = [(i, k, x) for i in ids for k, x in a[i]['c'].items() if past(x) and x.get('P') == 1]
        would = {i for i in ids if i in b for x in b[i]['c'].values() if past(x) and x.get('lift') == 'LMGF'}
        for i in ids:
            for x in a[i]['c'].values():
                if past(x):
                    t = early if a[i]['now'] < 90 else late
                    t[0] += 1
                    t[1] += x.get('lift', '-')[0] == 'L'
        lifts += [(a[i]['now'], x) for i, k, x in mine]
        later = sum(1 for i in ids if fd is not None and i > fd)
        print('| %s | %d | %d (%d) | %d | %s | %s |' % (s, len(ids), len(mine), sum(1 for i, k, x in mine if a[i]['to'] == k),
              len(would), '-' if fd is None else '%d, %.1f' % (fd, a[fd]['now']), '%d of %d' % (nd, later)))
    if lifts:
        def rng(v):
            return '%.3g-%.3g (median %.3g)' % (min(v), max(v), st.median(v))
        print('lifts: %d; at %s s; in flight %s; pending / capacity %s; resident / capacity %s; credit past the estimate %s'
              % (len(lifts), rng([t for t, _ in lifts]), rng([x['n0'] for _, x in lifts]),
                 rng([x['p0'] / x['cap'] for _, x in lifts]), rng([x['r0'] / x['cap'] for _, x in lifts]),
                 rng([x['x'] - x['est'] for _, x in lifts])))
    print('own exact overlaps past the estimate, load clause passing: before 90 s %d of %d, after %d of %d'
          % (early[1], early[0], late[1], late[0]))


if __name__ == '__main__':
    if len(sys.argv) < 3 or len(sys.argv) % 2 == 0:
        sys.exit(__doc__)
    main(sys.argv[1:])
