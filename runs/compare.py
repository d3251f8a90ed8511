"""Per load level: best agg, disagg, isl_bounding sweep point, slo_cost (goodput req/s)."""
import json, sys
d = json.load(open(sys.argv[1]))
levels = {}
for r in d["results"]:
    p, o = r["point"], r["outcome"]
    if o.get("status") != "measured":
        continue
    rep = o["report"]
    g = rep["goodput"]["requests_per_s"]
    kind = p["mode"] if p["mode"] != "conditional" else p["policy"]
    lab = rep["meta"]["label"]
    lv = levels.setdefault(p["load_level"], {})
    lv.setdefault(kind, []).append((g, lab, rep["routes"]["bypass_share"], rep["meta"]["offered_rps"], rep["routes"]["reasons"]))
print("| load | offered req/s | agg | best disagg | best isl_bounding (sweep) | slo_cost (best split) | slo_cost / best sweep | slo_cost at each split |")
print("|---|---|---|---|---|---|---|---|")
for lvl in sorted(levels):
    lv = levels[lvl]
    best = {k: max(v) for k, v in lv.items()}
    off = lv["agg"][0][3] if "agg" in lv else 0
    s = best.get("slo_cost")
    ib = best["isl_bounding"]
    splits = ", ".join(f"{lab.split()[1]}: {g:.3f} ({b*100:.0f} % bypass)" for g, lab, b, _, _ in lv.get("slo_cost", []))
    print(f"| {lvl:g}× | {off:.2f} | {best['agg'][0]:.3f} | {best['disagg'][0]:.3f} ({best['disagg'][1]}) | {ib[0]:.3f} ({ib[1]}) | {s[0]:.3f} ({s[1]}, {s[2]*100:.0f} % bypass) | {100*s[0]/ib[0]:.1f} % | {splits} |")
if len(sys.argv) > 2:
    for lvl in sorted(levels):
        for g, lab, b, _, reasons in levels[lvl].get("slo_cost", []):
            print(lvl, lab, round(g,3), reasons)
