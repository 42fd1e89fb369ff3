"""index.html: one self-contained page. The board's data sits in a JSON script tag and inline
JavaScript draws the tables, filters and figures, so the page needs no network and opens from disk."""
from __future__ import annotations

import html
import json

from ..report.colors import label_colors, place

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
/* A table wider than the screen scrolls in its box; its rank column stays in view (a phone's 400 px
   showed the scores with the ranks scrolled off), wrapping its note rather than taking the screen. */
th:first-child, td:first-child { position: sticky; left: 0; z-index: 1; background: #fff; white-space: normal;
                                 min-width: 4.5em; max-width: 9em; text-align: left; }
th:first-child { background: #f4f4f4; }
tr.unranked td { color: #777; }
.banner { background: #fff3cd; border: 1px solid #e0c36a; padding: 0.5em 0.8em; }
tr.preview td, tr.preview td:first-child { background: #fff3cd; color: #222; font-weight: bold; }
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
     show: r => (r.ranked ? String(r.rank) : 'unranked (' + r.seeds + (r.seeds === 1 ? ' seed)' : ' seeds)'))
                + (r.would_rank ? '; rank ' + r.would_rank + ' with 3 seeds' : '')},
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
    const tr = el('tr', {'data-slug': row.slug,
                         class: (row.ranked ? 'ranked' : 'unranked') + (row.preview ? ' preview' : '')});
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

// Each tick names only the axes that vary; where that is one axis, its name is said once under the
// axis and each tick gives a value.
function ticks(group) {
  const labels = group.levels.map(l => group.labels[l]);
  const parts = labels.map(t => t.split('='));
  const one = parts.every(p => p.length === 2 && p[0] === parts[0][0]);
  return one ? {axis: parts[0][0], names: parts.map(p => p[1])} : {axis: '', names: labels};
}

function figure(group) {
  // Drawn in its viewBox's units and scaled by CSS to the width it is given; the legend is HTML below it,
  // so that it wraps on a narrow screen instead of shrinking with the plot. Each row's colour is its
  // model label's, as every report draws it (set by page.py).
  // One level: a point per entry, side by side, instead of every entry's point on one spot.
  const single = group.levels.length === 1;
  const only = single ? group.labels[group.levels[0]] : '';
  const t = single ? {axis: only === '-' ? '' : only, names: group.rows.map(r => r.label || r.model)} : ticks(group);
  const n = t.names.length, W = 560, L = 44, R = 16, T = 22;
  // Each tick has a band of its own with its point in the middle, so that no label reaches past the plot;
  // labels wider than their band are turned.
  const band = (W - L - R) / n, longest = Math.max(...t.names.map(name => name.length));
  const turned = longest * 7.5 > band;
  const B = (turned ? 30 + 3.8 * longest : 36) + (t.axis ? 18 : 0), H = 210 + B;
  const x = i => L + (i + 0.5) * band;
  const y = v => T + (1 - v) * (H - T - B);
  const s = svg('svg', {viewBox: '0 0 ' + W + ' ' + H, class: 'figure', role: 'img',
                        'aria-label': (single ? 'accuracy per entry, ' : 'accuracy against level, ') + group.task});
  for (const v of [0, 0.25, 0.5, 0.75, 1]) {
    s.appendChild(svg('line', {x1: L, x2: W - R, y1: y(v), y2: y(v), stroke: '#eee'}));
    s.appendChild(svg('text', {x: L - 6, y: y(v) + 4, 'text-anchor': 'end'}, pct(v).replace('.0', '')));
  }
  t.names.forEach((name, i) => s.appendChild(svg('text', turned
    ? {x: x(i), y: H - B + 14, 'text-anchor': 'end', transform: 'rotate(-35 ' + x(i) + ' ' + (H - B + 14) + ')'}
    : {x: x(i), y: H - B + 18, 'text-anchor': 'middle'}, name)));
  const title = {x: L + (W - L - R) / 2, y: turned ? H - 6 : H - B + 40, 'text-anchor': 'middle'};
  if (t.axis) s.appendChild(svg('text', title, t.axis));
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
  const legend = el('ul', {class: 'legend'});
  let ringed = false, overlapping = false;
  const drawn = [];
  group.rows.forEach((row, k) => {
    const g = s.appendChild(svg('g', {'data-slug': row.slug}));
    const at = single ? group.rows.map((r, j) => j === k ? row.cells[group.levels[0]] : null)
                      : group.levels.map(l => row.cells[l]);
    // A line lying on one drawn before it (every level within half a point; a preview beside the
    // published entry of its model, say) would hide it: it is dashed, its dashes shifted, with hollow
    // points a size larger, and the legend says so.
    const means = at.map(c => c ? c.mean : null);
    const lies = other => means.some((v, i) => v !== null && other[i] !== null)
                          && means.every((v, i) => v === null || other[i] === null || Math.abs(v - other[i]) <= 0.005);
    const under = single ? 0 : drawn.filter(lies).length;
    drawn.push(means);
    overlapping = overlapping || under > 0;
    const dashed = under ? {'stroke-dasharray': '5 3', 'stroke-dashoffset': String(3 * under)} : {};
    if (!single) line(means, Object.assign({stroke: row.color, 'stroke-width': 2}, dashed), g);
    // The level an entry was trained at, where it was trained at one and evaluated at others.
    const one = !single && row.trained_at && row.trained_at.length === 1;
    const trained = one ? group.levels.indexOf(row.trained_at[0]) : -1;
    at.forEach((c, i) => {
      if (!c) return;
      g.appendChild(svg('line', {x1: x(i), x2: x(i), y1: y(c.low), y2: y(c.high), stroke: row.color}));
      g.appendChild(svg('circle', under ? {cx: x(i), cy: y(c.mean), r: 2.5 + 2 * under, fill: 'white',
                                           stroke: row.color, 'stroke-width': 1.5}
                                        : {cx: x(i), cy: y(c.mean), r: single ? 3.5 : 2.5, fill: row.color}));
      if (i === trained) {
        g.appendChild(svg('circle', {cx: x(i), cy: y(c.mean), r: 6, fill: 'none', stroke: row.color,
                                     'stroke-width': 1.5}));
        ringed = true;
      }
    });
    legend.appendChild(el('li')).append(el('span', {class: 'swatch', style: 'background: ' + row.color}), row.name);
  });
  // Chance and ceiling over the entries' lines, dashed: an entry at chance shows between the dashes and
  // cannot hide them.
  const across = key => single ? [group[key][group.levels[0]]] : group.levels.map(l => group[key][l]);
  for (const [key, dash] of [['chance', '5 3'], ['ceiling', '1.5 3']]) {
    const values = across(key), attrs = {stroke: '#222', 'stroke-width': 1.3, 'stroke-dasharray': dash};
    if (!single) line(values, attrs);
    else s.appendChild(svg('path', Object.assign({d: 'M' + L + ',' + y(values[0]) + ' L' + (W - R) + ',' + y(values[0]),
                                                 fill: 'none'}, attrs)));
  }
  legend.appendChild(el('li', {class: 'note'},
                       '- - - chance   ··· ceiling' + (ringed ? '   ○ the level it was trained at' : '')
                       + (overlapping ? '   dashed, hollow: a line lying on another' : '')));
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
<title>{title}</title>
<style>{style}</style>
</head>
<body>
<h1>{title}</h1>
{banner}
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


def with_colors(groups: list[dict]) -> list[dict]:
    """Each row's colour: its model label's, as every report draws it (report/colors.py), so that a
    registered model looks the same in a report and on the board. A label twice in one table (a preview
    beside the published entry) is told apart by its entry."""
    for group in groups:
        keys: list[str] = []
        for row in group["rows"]:
            label = row.get("label") or row["model"]
            keys.append(label if label not in keys else f"{label} ({row['slug']})")
        colors = label_colors(dict.fromkeys(row.get("label") or row["model"] for row in group["rows"]))
        colors = place([key for key in keys if key not in colors], colors)
        for row, key in zip(group["rows"], keys):
            row["color"] = colors[key]
    return groups


def render_page(data_json: str, banner: str | None = None) -> str:
    """The page; with `banner` (a preview's), titled a preview and opening with the banner."""
    data_json = json.dumps(with_colors(json.loads(data_json)), sort_keys=True)
    title = "tmem-bench leaderboard" if banner is None else "tmem-bench leaderboard preview"
    shown = "" if banner is None else f'<p class="banner" role="note">{html.escape(banner)}</p>'
    # "<" escaped inside the JSON so that no entry text can close the script tag.
    return TEMPLATE.format(style=STYLE, data=data_json.replace("<", "\\u003c"), script=SCRIPT, title=title,
                           banner=shown)
