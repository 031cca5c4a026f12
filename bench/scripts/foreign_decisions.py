#!/usr/bin/env python3
"""foreign_decisions.py: the precise path's foreign exact overlaps in a fleetsim decision log (EXPERIMENTS 110, fx29).

    fs -trace toolN.jsonl -replicas 8 -seeds N -kv-capacity 65536 -parallel 1 -policy ramjet-precise -decisions decN.log
    python3 bench/scripts/foreign_decisions.py decN.log

A decision is "foreign uncapped" when its chosen replica kept an exact overlap (P1) more than one router block (64
tokens) past the estimate's credit (est) on a block not marked as this router's (own0). For those and the others: the
chosen replica's pending prefill in KV capacities (65,536 tokens; CAP= to change) and against the candidates' mean,
its in-flight requests minus the mean, resident context against the mean (each before the decision), the request's
TTFT and the share of the exact overlap the engine served from cache when the request ran (obs cached / x).
"""
import collections, os, re, statistics as st, sys

CAP = int(os.environ.get("CAP", 65536))
def parse(fn):
    decs=[];first={};obs={}
    for line in open(fn):
        if line.startswith('id='):
            head,_,rest=line.partition('|')
            h=dict(re.findall(r'(\w+)=(\S+)',head))
            m=re.search(r'-> (-?\d+) (\S+)',head)
            d=dict(id=int(h['id']),now=float(h['now']),inp=int(h['in']),out=int(h['out']),ch=int(m.group(1)),reason=m.group(2),c={})
            for tok in rest.split():
                i,_,f=tok.partition(':')
                vals=dict(re.findall(r'([A-Za-z]+)(-?[\d.]+)',f))
                d['c'][int(i)]={k:float(v) for k,v in vals.items()}
            decs.append(d)
        elif line.startswith('first'):
            h=dict(re.findall(r'(\w+)=(\S+)',line)); first[int(h['id'])]=float(h['now'])
        elif line.startswith('obs'):
            h=dict(re.findall(r'(\w+)=(\S+)',line)); obs[int(h['id'])]=(int(h['prompt']),int(h['cached']))
    return decs,first,obs
decs,first,obs=parse(sys.argv[1])
rows=[]
for d in decs:
    ch=d['ch']
    if ch<0 or ch not in d['c']: continue
    c=d['c'][ch]
    # foreign uncapped: precise, own0, exact above estimate by > one block
    fu = c.get('P')==1 and c.get('own')==0 and c.get('x',-1)>c.get('est',0)+64
    # state before: chosen's n,p include this request
    pend=[ (v['p']-(d['inp'] if i==ch else 0)) for i,v in d['c'].items()]
    inf=[ (v['n']-(1 if i==ch else 0)) for i,v in d['c'].items()]
    res=[ (v['res']-(d['inp'] if i==ch else 0)) for i,v in d['c'].items()]
    k=list(d['c']).index(ch)
    anyfu = any(v.get('P')==1 and v.get('own')==0 and v.get('x',-1)>v.get('est',0)+64 for v in d['c'].values())
    ttft = first.get(d['id'],float('nan'))-d['now']
    pr,ca = obs.get(d['id'],(0,0))
    rows.append(dict(id=d['id'],now=d['now'],fu=fu,anyfu=anyfu,reason=d['reason'],inp=d['inp'],x=c.get('x',-1),est=c.get('est',0),eng=c.get('eng',-1),
        pend=pend[k],pmean=st.mean(pend),inf=inf[k],imean=st.mean(inf),res=res[k],rmean=st.mean(res),ttft=ttft,cached=ca))
fu=[r for r in rows if r['fu']]
print(sys.argv[1],'decisions',len(rows),'chosen foreign-uncapped',len(fu),'any cand fu',sum(r['anyfu'] for r in rows))
def summ(name,rs):
    if not rs: print(name,0); return
    f=lambda k: st.median([r[k] for r in rs])
    print(f"{name}: n={len(rs)} pend/cap med={f('pend')/CAP:.2f} pend/mean med={st.median([r['pend']/max(r['pmean'],1) for r in rs]):.2f} inf-mean med={st.median([r['inf']-r['imean'] for r in rs]):.2f} res/mean={st.median([r['res']/max(r['rmean'],1) for r in rs]):.2f} ttft med={f('ttft'):.1f} x-est med={st.median([r['x']-r['est'] for r in rs]):.0f} eng/x at run? cached/x med={st.median([r['cached']/max(r['x'],1) for r in rs]):.2f} reasons={dict((k,sum(1 for r in rs if r['reason'].startswith(k))) for k in set(r['reason'].split('/')[0] for r in rs))}")
summ('fu',fu)
summ('fu first half',[r for r in fu if r['id']<600])
summ('fu second half',[r for r in fu if r['id']>=600])
summ('other',[r for r in rows if not r['fu']])
# bucket by pend/mean
for lo,hi in [(0,0.5),(0.5,1),(1,1.5),(1.5,99)]:
    summ(f'fu pend/mean in [{lo},{hi})',[r for r in fu if lo<=r['pend']/max(r['pmean'],1)<hi])
for lo,hi in [(0,1),(1,2),(2,4),(4,99)]:
    summ(f'fu pend/cap in [{lo},{hi})',[r for r in fu if lo<=r['pend']/CAP<hi])
def q(v): 
    v=sorted(v); n=len(v); return [round(v[int(n*p)],2) for p in (0.1,0.25,0.5,0.75,0.9)] if v else []
print('inf/imean fu',q([r['inf']/max(r['imean'],0.1) for r in fu]),'other',q([r['inf']/max(r['imean'],0.1) for r in rows if not r['fu']]))
print('imean fu',q([r['imean'] for r in fu]))
for lo,hi in [(0,1),(1,1.2),(1.2,1.5),(1.5,99)]:
    summ(f'fu inf/mean in [{lo},{hi})',[r for r in fu if lo<=r['inf']/max(r['imean'],0.1)<hi])
