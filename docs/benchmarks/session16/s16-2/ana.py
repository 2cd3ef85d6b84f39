import csv, sys, re, collections
path = sys.argv[1]
rows = list(csv.reader(open(path)))
hdr = rows[1]; data = rows[2:]
ix = {h: i for i, h in enumerate(hdr)}
stalls = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
def num(x):
    try: return float(x.replace(",", ""))
    except: return 0.0
# partition segmentation by USETMAXREG markers and BRA structure: mark region starts
ins = []
for r in data:
    if len(r) < len(hdr): continue
    ins.append((r[ix["Address"]], r[ix["Source"]], num(r[ix["Warp Stall Sampling (All Samples)"]]), {s: num(r[ix[s]]) for s in stalls}, num(r[ix["Instructions Executed"]])))
total = sum(i[2] for i in ins)
print("instructions", len(ins), "samples", total)
for n, (a, src, smp, st, ex) in enumerate(ins):
    if "SETMAXREG" in src:
        print(n, a, src.strip())
segs = [("prologue", 0, 50), ("softmax A", 50, 1053), ("loader", 1053, 1449), ("softmax B", 1449, 2540), ("pre-PV", 2540, 2682), ("P·V", 2682, 3952), ("tail", 3952, len(ins))]
for name, a, b in segs:
    seg = ins[a:b]
    t = sum(i[2] for i in seg)
    agg = collections.Counter()
    for i in seg:
        for k, v in i[3].items(): agg[k] += v
    top = ", ".join(f"{k[6:]} {v/t*100:.0f}%" for k, v in agg.most_common(6) if v > 0) if t else ""
    print(f"\n== {name}: {t:.0f} samples ({t/total*100:.1f}%): {top}")
    for i in sorted(seg, key=lambda x: -x[2])[:int(sys.argv[2]) if len(sys.argv) > 2 else 8]:
        reasons = ", ".join(f"{k[6:]} {v:.0f}" for k, v in sorted(i[3].items(), key=lambda kv: -kv[1])[:3] if v > 0)
        print(f"   {i[2]:8.0f} {i[2]/t*100:5.1f}%  {i[1].strip()[:70]:70} [{reasons}]")
