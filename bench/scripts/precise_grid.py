#!/usr/bin/env python3
"""precise_grid.py: summarise precise_grid.sh's draws (EXPERIMENTS 108, helper prec28).

    python3 bench/scripts/precise_grid.py OUT [B_POLICY [A_POLICY]]
    PRETTY=1 python3 bench/scripts/precise_grid.py OUT                # cells named for the reader
    UNITS=tool_kv65536 python3 bench/scripts/precise_grid.py OUT   # also one row per unit (trace) of that cell

Per draw (one JSON file, both policies in one fleetsim process): B over A ratios of TTFT p50/p95/p99 and output
tok/s, the difference of cached share. Per cell: the median over draws, [draws worse], and a 90% bootstrap
interval of the median resampling the cell's units (tool-agent traces: a trace's rates move together; seeds
otherwise), 4,000 resamples, random.Random(1), 5th-95th percentile. Class: equal (every draw's figures identical),
medians equal (every median and interval exactly no change, some draws not), better / LOSS (some metric's interval excludes no-change on the good / wrong side), noise (every interval spans it).
"""
import glob, json, os, random, sys
from collections import defaultdict

out = sys.argv[1]
B = sys.argv[2] if len(sys.argv) > 2 else 'ramjet-precise'
A = sys.argv[3] if len(sys.argv) > 3 else 'ramjet'
KEYS = ['cached_share', 'ttft_p50_s', 'ttft_p95_s', 'ttft_p99_s', 'output_tokens_per_s']
LOWER = {'ttft_p50_s', 'ttft_p95_s', 'ttft_p99_s'}  # lower is better
SHORT = {'cached_share': 'cached', 'ttft_p50_s': 'p50', 'ttft_p95_s': 'p95', 'ttft_p99_s': 'p99', 'output_tokens_per_s': 'tok/s'}

cells = defaultdict(list)  # cell -> [(unit, draw-figures)]
for f in sorted(glob.glob(os.path.join(out, '*.json'))):
    base = os.path.basename(f)[:-5]
    cell, draw = base.split('__')
    unit = draw.split('_r')[0]
    rows = json.load(open(f))
    by = defaultdict(dict)
    for r in rows:
        by[r['workload']][r['policy']] = r
    for wl, p in by.items():
        if A not in p or B not in p:
            continue
        a, b = p[A], p[B]
        fig = {}
        ident = all(a[k]['median'] == b[k]['median'] for k in KEYS + ['failed', 'requests'])
        for k in KEYS:
            x, y = a[k]['median'], b[k]['median']
            fig[k] = y - x if k == 'cached_share' else (y / x if x else float('nan'))
        fig['ident'] = ident
        name = cell if wl.startswith('trace:') or cell.startswith('af_') or cell.startswith('r64_') else cell + ':' + wl
        cells[name].append((unit, fig))

def median(v):
    v = sorted(v)
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2

def boot(draws, k, rng, n=4000):
    units = sorted({u for u, _ in draws})
    per = defaultdict(list)
    for u, f in draws:
        per[u].append(f[k])
    ms = []
    for _ in range(n):
        s = []
        for _ in units:
            s.extend(per[rng.choice(units)])
        ms.append(median(s))
    ms.sort()
    return ms[int(0.05 * n)], ms[int(0.95 * n) - 1]

def kvname(k):
    return 'default KV (259,136)' if k == '0' else f'{int(k):,}'

def pretty(c):
    """The cell's name for the table (PRETTY=1)."""
    if not os.environ.get('PRETTY'):
        return c
    base, _, wl = c.partition(':')
    if base.startswith('tool_kv'):
        return f'tool-agent traces, 8 x {kvname(base[7:])}'
    if base.startswith('af_sc'):
        sc, kv = base[5:].split('_kv')
        return f'agent-fleet scale {sc}, 8 x {kvname(kv)}'
    if base.startswith('r64_'):
        return {'af': 'agent-fleet', 'sp': 'shared-prefix', 'conv': 'conversation traces'}.get(base[4:], base[4:]) + ', 64 x default KV'
    if base.startswith('syn_kv') or base.startswith('sp_kv'):
        kv = base.split('_kv')[1]
        return f'{wl}, {"2" if wl == "spec-pair" else "8"} x {kvname(kv)}'
    return c

def order(c):
    pri = ['tool_kv65536', 'tool_kv196608', 'tool_kv0', 'af_sc1_', 'af_sc0.5_', 'af_sc0.25_', 'syn_kv65536', 'syn_kv0', 'syn_kv196608', 'r64']
    for i, p in enumerate(pri):
        if c.startswith(p):
            return (i, c)
    return (99, c)

print(f'B = {B}, A = {A}; median over draws [draws worse] (90% bootstrap interval of the median, units resampled)')
print('class: equal = every draw identical; medians equal = every median and interval exactly no change, some draws not;')
print('LOSS / better = an interval excludes no change (wrong / good side); noise = every interval spans it\n')
print('| cell | draws (units) | identical | d cached | TTFT p50 x | TTFT p95 x | TTFT p99 x | output tok/s x | class |')
print('|---|---:|---:|---|---|---|---|---|---|')
for c in sorted(cells, key=order):
    d = cells[c]
    rng = random.Random(1)
    nid = sum(1 for _, f in d if f['ident'])
    cols, cls, flat = [], set(), True
    for k in KEYS:
        v = [f[k] for _, f in d]
        m = median(v)
        lo, hi = boot(d, k, rng)
        if k == 'cached_share':
            worse = sum(1 for x in v if x < 0)
            cols.append(f'{m:+.4f} [{worse}] ({lo:+.4f}..{hi:+.4f})')
            good, bad = lo > 0, hi < 0
        else:
            worse = sum(1 for x in v if (x > 1 if k in LOWER else x < 1))
            cols.append(f'{m:.3f} [{worse}] ({lo:.3f}-{hi:.3f})')
            if k in LOWER:
                good, bad = hi < 1, lo > 1
            else:
                good, bad = lo > 1, hi < 1
        flat = flat and lo == hi == (0 if k == 'cached_share' else 1)
        if bad:
            cls.add('LOSS ' + SHORT[k])
        elif good:
            cls.add('better ' + SHORT[k])
    if nid == len(d):
        klass = 'equal'
    elif flat:
        klass = 'medians equal (%d of %d draws differ)' % (len(d) - nid, len(d))
    elif not cls:
        klass = 'noise'
    else:
        klass = ', '.join(sorted(cls, key=lambda s: (not s.startswith('LOSS'), s)))
    units = len({u for u, _ in d})
    print(f'| {pretty(c)} | {len(d)} ({units}) | {nid} | ' + ' | '.join(cols) + f' | {klass} |')

cell = os.environ.get('UNITS')
if cell:
    print(f'\n{cell}, per unit: median over its draws [draws worse]\n')
    print('| unit | draws | d cached | TTFT p50 x | TTFT p95 x | TTFT p99 x | output tok/s x |')
    print('|---|---:|---|---|---|---|---|')
    per = defaultdict(list)
    for u, f in cells[cell]:
        per[u].append(f)
    for u in sorted(per, key=lambda u: int(''.join(ch for ch in u if ch.isdigit()) or 0)):
        fs = per[u]
        cols = []
        for k in KEYS:
            v = [f[k] for f in fs]
            if k == 'cached_share':
                cols.append(f'{median(v):+.4f} [{sum(1 for x in v if x < 0)}]')
            else:
                w = sum(1 for x in v if (x > 1 if k in LOWER else x < 1))
                cols.append(f'{median(v):.3f} [{w}]')
        print(f'| {u} | {len(fs)} | ' + ' | '.join(cols) + ' |')
