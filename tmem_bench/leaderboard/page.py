"""index.html: one self-contained page. The board's data sits in a JSON script tag and inline
JavaScript draws the tables, filters and figures, so the page needs no network and opens from disk."""
from __future__ import annotations

STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em auto; max-width: 1200px; padding: 0 1em; color: #222;
       overflow-wrap: anywhere; }
h1 { font-size: 1.5em; } h2 { font-size: 1.15em; margin-top: 2em; }
.filters label { margin-right: 1.5em; display: inline-block; }
/* A wide table scrolls inside its own box; the page itself never gets wider than the screen. */
.scroll { overflow-x: auto; max-width: 100%; }
table { border-collapse: collapse; margin: 0.5em 0; font-variant-numeric: tabular-nums; overflow-wrap: normal; }
th, td { border-bottom: 1px solid #ddd; padding: 0.25em 0.6em; text-align: right; white-space: nowrap; }
th { background: #f4f4f4; }
th button { font: inherit; font-weight: bold; color: inherit; background: none; border: 0; padding: 0; cursor: pointer;
            text-align: inherit; }
th[aria-sort=ascending] button::after { content: " \\25B2"; }
th[aria-sort=descending] button::after { content: " \\25BC"; }
td.text, th.text { text-align: left; }
tr.unranked td { color: #777; }
.note { color: #555; font-size: 0.9em; }
figure { margin: 0; }
svg.figure { display: block; width: 100%; max-width: 640px; height: auto; }
svg text { font-size: 13px; fill: #333; }
.legend { list-style: none; padding: 0; margin: 0.25em 0; display: flex; flex-wrap: wrap; gap: 0.2em 1.2em;
          font-size: 0.9em; }
.swatch { display: inline-block; width: 1.4em; height: 3px; vertical-align: middle; margin-right: 0.4em; }
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
     show: r => r.ranked ? String(r.rank) : 'unranked (' + r.seeds + (r.seeds === 1 ? ' seed)' : ' seeds)')},
    {key: 'name', label: 'entry', text: true, value: r => r.name.toLowerCase(), show: r => r.name, link: true},
    {key: 'model', label: 'model', text: true, value: r => r.model, show: r => r.model},
    {key: 'params', label: 'params', value: r => r.params, show: r => r.params.toLocaleString('en')},
    {key: 'state', label: 'state', value: r => r.state_bytes === null ? Infinity : r.state_bytes, show: r => r.state},
    {key: 'seeds', label: 'seeds', value: r => r.seeds, show: r => String(r.seeds)},
    {key: 'score', label: group.score_label, value: r => r.score, show: r => pct(r.score)},
  ];
  // The all-level mean beside the ranking score, where the table ranks by the trained level.
  if (group.mean_label) cols.push({key: 'mean', label: group.mean_label, value: r => r.mean, show: r => pct(r.mean)});
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
  // A button in each header: reached with Tab and pressed with Enter or Space like any button.
  // The rows arrive ranked, that is in ascending rank.
  cols.forEach(c => head.appendChild(el('th', {'data-key': c.key, class: c.text ? 'text' : '', scope: 'col',
                                              'aria-sort': c.key === 'rank' ? 'ascending' : 'none'}))
                        .appendChild(el('button', {type: 'button'}, c.label)));
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
  head.querySelectorAll('th').forEach((th, index) => th.querySelector('button').addEventListener('click', () => {
    const ascending = th.getAttribute('aria-sort') !== 'ascending';
    head.querySelectorAll('th').forEach(h => h.setAttribute('aria-sort', 'none'));
    th.setAttribute('aria-sort', ascending ? 'ascending' : 'descending');
    const rows = Array.from(body.rows);
    rows.sort((a, b) => {
      const x = a.cells[index].dataset, y = b.cells[index].dataset;
      const d = x.numeric === '1' ? Number(x.value) - Number(y.value) : x.value.localeCompare(y.value);
      return ascending ? d : -d;
    });
    rows.forEach(r => body.appendChild(r));
  }));
  const box = el('div', {class: 'scroll', tabindex: '0', role: 'region', 'aria-label': 'table: ' + group.task});
  box.appendChild(t);
  return box;
}

// One colour per entry on the whole page, so that an entry looks the same in every figure.
const SLUGS = Array.from(new Set(DATA.flatMap(g => g.rows.map(r => r.slug)))).sort();
const colorOf = slug => COLORS[SLUGS.indexOf(slug) % COLORS.length];

function figure(group) {
  // Drawn in its viewBox's units and scaled by CSS to the width it is given; the legend is HTML below it,
  // so that it wraps on a narrow screen instead of shrinking with the plot.
  const W = 560, H = 250, L = 44, R = 40, T = 22, B = 40;
  const n = group.levels.length;
  const x = i => L + (n === 1 ? (W - L - R) / 2 : i * (W - L - R) / (n - 1));
  const y = v => T + (1 - v) * (H - T - B);
  const s = svg('svg', {viewBox: '0 0 ' + W + ' ' + H, class: 'figure', role: 'img',
                        'aria-label': 'accuracy against level, ' + group.task});
  for (const v of [0, 0.25, 0.5, 0.75, 1]) {
    s.appendChild(svg('line', {x1: L, x2: W - R, y1: y(v), y2: y(v), stroke: '#eee'}));
    s.appendChild(svg('text', {x: L - 6, y: y(v) + 4, 'text-anchor': 'end'}, pct(v).replace('.0', '')));
  }
  group.levels.forEach((level, i) => s.appendChild(svg('text', {x: x(i), y: H - B + 18, 'text-anchor': 'middle'},
                                                       group.labels[level])));
  s.appendChild(svg('text', {x: L - 6, y: T - 10, 'text-anchor': 'end'}, '%'));
  // The pen is lifted where a level has no value: a missing level is a gap, not a line across it.
  const line = (values, attrs, parent = s) => {
    let d = '', down = false;
    values.forEach((v, i) => {
      if (v === null || v === undefined) { down = false; return; }
      d += (down ? ' L' : ' M') + x(i) + ',' + y(v);
      down = true;
    });
    parent.appendChild(svg('path', Object.assign({d: d.trim(), fill: 'none'}, attrs)));
  };
  line(group.levels.map(l => group.chance[l]), {stroke: '#999', 'stroke-dasharray': '4 3'});
  line(group.levels.map(l => group.ceiling[l]), {stroke: '#999', 'stroke-dasharray': '1 3'});
  const legend = el('ul', {class: 'legend'});
  group.rows.forEach(row => {
    const color = colorOf(row.slug);
    const g = s.appendChild(svg('g', {'data-slug': row.slug}));
    line(group.levels.map(l => row.cells[l] ? row.cells[l].mean : null), {stroke: color, 'stroke-width': 2}, g);
    group.levels.forEach((l, i) => {
      const c = row.cells[l];
      if (!c) return;
      g.appendChild(svg('line', {x1: x(i), x2: x(i), y1: y(c.low), y2: y(c.high), stroke: color}));
      g.appendChild(svg('circle', {cx: x(i), cy: y(c.mean), r: 2.5, fill: color}));
    });
    legend.appendChild(el('li')).append(el('span', {class: 'swatch', style: 'background: ' + color}), row.name);
  });
  legend.appendChild(el('li', {class: 'note'}, '- - - chance   ··· ceiling'));
  const box = el('figure');
  box.append(s, legend);
  return box;
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
  // A part's heading shows while a table under it does.
  document.querySelectorAll('h2.part').forEach(head => {
    let next = head.nextElementSibling, any = false;
    while (next && next.tagName === 'SECTION') { any = any || next.style.display !== 'none'; next = next.nextElementSibling; }
    head.style.display = any ? '' : 'none';
  });
}

const unique = key => Array.from(new Set(DATA.map(g => g[key]))).sort();
fillSelect('filter-profile', unique('profile'));
fillSelect('filter-task', unique('task'));
const board = document.getElementById('board');
if (!DATA.length) board.appendChild(el('p', {}, 'No entries yet.'));
let part = null;
for (const group of DATA) {
  if (part !== group.profile + '|' + group.kind) {
    part = group.profile + '|' + group.kind;
    board.appendChild(el('h2', {class: 'part', 'data-profile': group.profile},
                         group.kind_title + ' (profile ' + group.profile + ')'));
  }
  const sec = el('section', {class: 'group', 'data-profile': group.profile, 'data-task': group.task,
                             'data-variant': group.variant, 'data-kind': group.kind});
  const variant = group.variant === 'standard' ? '' : ' [' + group.variant + ']';
  sec.appendChild(el('h3', {}, group.task + variant + ' (profile ' + group.profile + ')'));
  sec.appendChild(el('p', {class: 'about'}, group.about));
  sec.appendChild(figure(group));
  sec.appendChild(table(group));
  sec.appendChild(el('p', {class: 'note'}, 'Hover a row for the command and machine it was run with.'));
  board.appendChild(sec);
}
"""

TEMPLATE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>tmem-bench leaderboard</title>
<style>{style}</style>
</head>
<body>
<h1>tmem-bench leaderboard</h1>
<p class="note">Every number is rebuilt from the entries' cell files by <code>tmem-bench leaderboard validate</code>.
Accuracy is raw, on each level's fixed evaluation set; a level shows the mean over seeds and its 95% bootstrap
interval. A table is ranked by the trained-level score, the accuracy at the level its models were trained at; the
all-level mean is beside it; equal scores at one decimal share a rank. Profiles are never ranked together; entries
with fewer than three seeds are unranked. Click a column's header, or reach it with Tab and press Enter, to sort.</p>
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
