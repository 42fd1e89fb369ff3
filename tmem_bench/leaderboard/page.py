"""index.html: one self-contained page. The board's data sits in a JSON script tag and inline
JavaScript draws the tables, filters and figures, so the page needs no network and opens from disk."""
from __future__ import annotations

STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em auto; max-width: 1200px; padding: 0 1em; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.15em; margin-top: 2em; }
.filters label { margin-right: 1.5em; }
table { border-collapse: collapse; margin: 0.5em 0; font-variant-numeric: tabular-nums; }
th, td { border-bottom: 1px solid #ddd; padding: 0.25em 0.6em; text-align: right; white-space: nowrap; }
th { cursor: pointer; user-select: none; background: #f4f4f4; }
th.sorted-asc::after { content: " \\25B2"; } th.sorted-desc::after { content: " \\25BC"; }
td.text, th.text { text-align: left; }
tr.unranked td { color: #777; }
.note { color: #555; font-size: 0.9em; }
svg text { font-size: 10px; fill: #333; }
"""

SCRIPT = r"""
const DATA = JSON.parse(document.getElementById('board-data').textContent);
const COLORS = ['#1f77b4', '#d62728', '#2ca02c', '#9467bd', '#ff7f0e', '#8c564b', '#e377c2', '#17becf'];
const SVGNS = 'http://www.w3.org/2000/svg';
const pct = x => (100 * x).toFixed(1);

function el(tag, attrs, text) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

function svg(tag, attrs, text) {
  const node = document.createElementNS(SVGNS, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

function columns(group) {
  const cols = [
    {key: 'rank', label: 'rank', value: r => r.ranked ? r.rank : Infinity,
     show: r => r.ranked ? String(r.rank) : 'unranked (' + r.seeds + ' seeds)'},
    {key: 'name', label: 'entry', text: true, value: r => r.name.toLowerCase(), show: r => r.name, link: true},
    {key: 'model', label: 'model', text: true, value: r => r.model, show: r => r.model},
    {key: 'params', label: 'params', value: r => r.params, show: r => r.params.toLocaleString('en')},
    {key: 'state', label: 'state', value: r => r.state_bytes === null ? Infinity : r.state_bytes, show: r => r.state},
    {key: 'seeds', label: 'seeds', value: r => r.seeds, show: r => String(r.seeds)},
    {key: 'score', label: 'score %', value: r => r.score, show: r => pct(r.score)},
  ];
  group.levels.forEach((level, i) => cols.push({
    key: 'level' + i, label: group.labels[level] + ' %',
    value: r => r.cells[level] ? r.cells[level].mean : -Infinity,
    show: r => {
      const c = r.cells[level];
      return c ? pct(c.mean) + ' [' + pct(c.low) + ', ' + pct(c.high) + ']' : '–';
    },
  }));
  return cols;
}

function table(group) {
  const cols = columns(group);
  const t = el('table');
  const head = el('tr');
  cols.forEach(c => head.appendChild(el('th', {'data-key': c.key, class: c.text ? 'text' : ''}, c.label)));
  t.appendChild(el('thead')).appendChild(head);
  const body = t.appendChild(el('tbody'));
  for (const row of group.rows) {
    const tr = el('tr', {'data-slug': row.slug, class: row.ranked ? 'ranked' : 'unranked'});
    tr.title = row.command + ' | ' + row.cpu + ' | ' + row.devices + (row.description ? ' | ' + row.description : '');
    for (const c of cols) {
      const td = el('td', {class: c.text ? 'text' : ''});
      const v = c.value(row);
      td.dataset.value = typeof v === 'number' ? String(v) : v;
      td.dataset.numeric = typeof v === 'number' ? '1' : '0';
      if (c.link && row.url) td.appendChild(el('a', {href: row.url}, c.show(row)));
      else td.textContent = c.show(row);
      tr.appendChild(td);
    }
    body.appendChild(tr);
  }
  head.querySelectorAll('th').forEach((th, index) => th.addEventListener('click', () => {
    const ascending = !th.classList.contains('sorted-asc');
    head.querySelectorAll('th').forEach(h => h.classList.remove('sorted-asc', 'sorted-desc'));
    th.classList.add(ascending ? 'sorted-asc' : 'sorted-desc');
    const rows = Array.from(body.rows);
    rows.sort((a, b) => {
      const x = a.cells[index].dataset, y = b.cells[index].dataset;
      const d = x.numeric === '1' ? Number(x.value) - Number(y.value) : x.value.localeCompare(y.value);
      return ascending ? d : -d;
    });
    rows.forEach(r => body.appendChild(r));
  }));
  return t;
}

// One colour per entry on the whole page, so that an entry looks the same in every figure.
const SLUGS = Array.from(new Set(DATA.flatMap(g => g.rows.map(r => r.slug)))).sort();
const colorOf = slug => COLORS[SLUGS.indexOf(slug) % COLORS.length];

function figure(group) {
  const W = 680, H = 240, L = 44, R = 190, T = 12, B = 40;
  const n = group.levels.length;
  const x = i => L + (n === 1 ? (W - L - R) / 2 : i * (W - L - R) / (n - 1));
  const y = v => T + (1 - v) * (H - T - B);
  const s = svg('svg', {width: W, height: H, viewBox: '0 0 ' + W + ' ' + H, role: 'img',
                        'aria-label': 'accuracy against level, ' + group.task});
  for (const v of [0, 0.25, 0.5, 0.75, 1]) {
    s.appendChild(svg('line', {x1: L, x2: W - R, y1: y(v), y2: y(v), stroke: '#eee'}));
    s.appendChild(svg('text', {x: L - 6, y: y(v) + 3, 'text-anchor': 'end'}, pct(v).replace('.0', '')));
  }
  group.levels.forEach((level, i) => s.appendChild(svg('text', {x: x(i), y: H - B + 14, 'text-anchor': 'middle'},
                                                       group.labels[level])));
  s.appendChild(svg('text', {x: 4, y: T + 4}, '%'));
  const line = (values, attrs) => s.appendChild(svg('polyline', Object.assign({
    points: values.map((v, i) => v === null ? null : x(i) + ',' + y(v)).filter(p => p).join(' '),
    fill: 'none'}, attrs)));
  line(group.levels.map(l => group.chance[l]), {stroke: '#999', 'stroke-dasharray': '4 3'});
  line(group.levels.map(l => group.ceiling[l]), {stroke: '#999', 'stroke-dasharray': '1 3'});
  group.rows.forEach((row, k) => {
    const color = colorOf(row.slug);
    line(group.levels.map(l => row.cells[l] ? row.cells[l].mean : null), {stroke: color, 'stroke-width': 2});
    group.levels.forEach((l, i) => {
      const c = row.cells[l];
      if (!c) return;
      s.appendChild(svg('line', {x1: x(i), x2: x(i), y1: y(c.low), y2: y(c.high), stroke: color}));
      s.appendChild(svg('circle', {cx: x(i), cy: y(c.mean), r: 2.5, fill: color}));
    });
    s.appendChild(svg('text', {x: W - R + 8, y: T + 12 + 14 * k, style: 'fill: ' + color}, row.name));
  });
  s.appendChild(svg('text', {x: W - R + 8, y: T + 12 + 14 * group.rows.length, style: 'fill: #777'},
                    '- - chance  ··· ceiling'));
  return s;
}

function fillSelect(id, values) {
  const select = document.getElementById(id);
  select.appendChild(el('option', {value: ''}, 'all'));
  for (const v of values) select.appendChild(el('option', {value: v}, v));
  select.addEventListener('change', applyFilters);
}

function applyFilters() {
  const profile = document.getElementById('filter-profile').value;
  const task = document.getElementById('filter-task').value;
  document.querySelectorAll('section.group').forEach(sec => {
    const shown = (!profile || sec.dataset.profile === profile) && (!task || sec.dataset.task === task);
    sec.style.display = shown ? '' : 'none';
  });
}

const unique = key => Array.from(new Set(DATA.map(g => g[key]))).sort();
fillSelect('filter-profile', unique('profile'));
fillSelect('filter-task', unique('task'));
const board = document.getElementById('board');
if (!DATA.length) board.appendChild(el('p', {}, 'No entries yet.'));
for (const group of DATA) {
  const sec = el('section', {class: 'group', 'data-profile': group.profile, 'data-task': group.task,
                             'data-variant': group.variant});
  const variant = group.variant === 'standard' ? '' : ' [' + group.variant + ']';
  sec.appendChild(el('h2', {}, group.task + variant + ' (profile ' + group.profile + ')'));
  sec.appendChild(figure(group));
  sec.appendChild(table(group));
  sec.appendChild(el('p', {class: 'note'},
                     group.chance_note + '. Hover a row for the command and machine it was run with.'));
  board.appendChild(sec);
}
"""

TEMPLATE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>tmem-bench leaderboard</title>
<style>{style}</style>
</head>
<body>
<h1>tmem-bench leaderboard</h1>
<p class="note">Every number is rebuilt from the entries' cell files by <code>tmem-bench leaderboard validate</code>.
Accuracy is raw, on each level's fixed evaluation set; a level shows the mean over seeds and its 95% bootstrap
interval; the score is the mean of the levels. Profiles are never ranked together; entries with fewer than three
seeds are unranked. Click a column to sort.</p>
<div class="filters">
<label>profile <select id="filter-profile"></select></label>
<label>task <select id="filter-task"></select></label>
</div>
<div id="board"></div>
<script type="application/json" id="board-data">{data}</script>
<script>{script}</script>
</body>
</html>
"""


def render_page(data_json: str) -> str:
    # "<" escaped inside the JSON so that no entry text can close the script tag.
    return TEMPLATE.format(style=STYLE, data=data_json.replace("<", "\\u003c"), script=SCRIPT)
