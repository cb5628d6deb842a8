# Compare a trace_dump output with llama.cpp's per-node trace (../shared/conformance/traces/, format in its
# README): for every node both have, the largest absolute / relative difference over llama.cpp's printed
# values (first/last 4 of the first/last rows). Usage:
#   python3 cmp.py TRACE            -> prints the trace's prompt token ids
#   python3 cmp.py TRACE DUMP       -> one line per node, in graph order
import re, sys, math
def parse_trace(path):
    nodes = []; ids = []
    lines = open(path).read().split('\n')
    i = 0
    hdr = re.compile(r'common_debug_cb_eval:\s+(.*?) = \((\w+)\)\s+(\w+)\((.*)\) = \{(\d+), (\d+), (\d+), (\d+)\}')
    while i < len(lines):
        l = lines[i]
        m = re.search(r'I\s+(\d+)$', l)
        if 'common_debug_cb_eval' not in l and m and not nodes: ids.append(int(m.group(1)))
        mh = hdr.search(l)
        if mh:
            name, typ, op = mh.group(1).strip(), mh.group(2), mh.group(3)
            ne = [int(mh.group(k)) for k in range(5, 9)]
            body = []
            i += 1
            while i < len(lines) and 'sum =' not in lines[i]:
                body.append(lines[i]); i += 1
            s = float(lines[i].split('=')[1]) if i < len(lines) else None
            toks = re.findall(r'\[|\]|\.\.\.|[-+]?(?:\d+\.?\d*(?:e[-+]?\d+)?|nan|inf)', ' '.join(body))
            pos = 0
            def rec():
                nonlocal pos
                assert toks[pos] == '['; pos += 1
                items = []
                while toks[pos] != ']':
                    if toks[pos] == '[': items.append(rec())
                    elif toks[pos] == '...': items.append('...'); pos += 1
                    else: items.append(float(toks[pos])); pos += 1
                pos += 1
                return items
            tree = rec() if toks else None
            nodes.append(dict(name=name, type=typ, op=op, ne=ne, tree=tree, sum=s))
        i += 1
    return ids, nodes
def elems(tree, ne):
    # yields ((i0,i1,i2), value); tree is nested [i3? no: top is i2 level] ggml prints i3 outer? handle 3 levels
    out = []
    def idx(items, n):
        res = []; k = 0
        if '...' in items:
            p = items.index('...'); before = items[:p]; after = items[p+1:]
            for j, it in enumerate(before): res.append((j, it))
            for j, it in enumerate(after): res.append((n - len(after) + j, it))
        else:
            for j, it in enumerate(items): res.append((j, it))
        return res
    for i2, t2 in idx(tree, ne[2]):
        for i1, t1 in idx(t2, ne[1]):
            for i0, v in idx(t1, ne[0]):
                out.append(((i0, i1, i2), v))
    return out
def parse_ours(path):
    d = {}; cur = None
    for l in open(path):
        if l.startswith('NODE'):
            _, name, a, b, c = l.split(); cur = name; d[name] = ([int(a), int(b), int(c)], [])
        else: d[cur][1].append(float(l))
    return d
if __name__ == '__main__':
    ids, nodes = parse_trace(sys.argv[1])
    if len(sys.argv) == 2: print(' '.join(map(str, ids))); sys.exit()
    ours = parse_ours(sys.argv[2])
    seen = {}
    for nd in nodes:
        nm = nd['name']; seen[nm] = seen.get(nm, 0) + 1
        key = None
        base = nm.split('-')[0]; L = nm[len(base):]
        if nd['op'] == 'MUL_MAT' and base in ('Qcur', 'Kcur', 'Vcur'): key = nm
        elif nd['op'] == 'ROPE' and base in ('Qcur', 'Kcur'): key = base[0] + 'rope' + L
        elif nd['op'] in ('RESHAPE', 'VIEW', 'PERMUTE') and nm.startswith('kqv_out'): key = nm
        elif nd['op'] in ('RESHAPE','VIEW','PERMUTE','SET_ROWS','CPY','ARGSORT','GET_ROWS','SUM_ROWS','CLAMP'): continue
        else: key = nm
        if key not in ours or nd['tree'] is None: continue
        ne_o, vals = ours[key]
        tne = nd['ne']
        maxd = 0; maxr = 0
        for (i0, i1, i2), v in elems(nd['tree'], tne):
            flat = i0 + tne[0] * (i1 + tne[1] * i2)
            tot = tne[0]*tne[1]*tne[2]
            if tot < len(vals): flat += len(vals) - tot
            o = vals[flat]
            dd = abs(o - v); maxd = max(maxd, dd); maxr = max(maxr, dd / max(abs(v), 1e-3))
        print(f'{key:28s} {nd["op"]:12s} maxabs {maxd:.3e} maxrel {maxr:.3e}')
def detail(trace, ours_path, key, opname):
    ids, nodes = parse_trace(trace); ours = parse_ours(ours_path)
    for nd in nodes:
        if nd['name'] == key and nd['op'] == opname:
            ne_o, vals = ours[key]; tne = nd['ne']
            for (i0, i1, i2), v in elems(nd['tree'], tne):
                flat = i0 + tne[0] * (i1 + tne[1] * i2)
                tot = tne[0]*tne[1]*tne[2]
                if tot < len(vals): flat += len(vals) - tot
                print((i0,i1,i2), v, vals[flat], vals[flat]-v)
            return
