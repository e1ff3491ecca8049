"""The HTML report's inline style sheet and script: the page opens with no network.

The script sorts the record tables by a clicked column and filters the comparison rows.
"""

__all__ = ["SCRIPT", "STYLE"]

STYLE = """
:root { --pass: #1a7f37; --fail: #cf222e; --mark: #fff3c4; --line: #d0d7de; --muted: #57606a; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif;
       color: #1f2328; background: #f6f8fa; }
main { max-width: 1200px; margin: 0 auto; padding: 20px 24px 48px; }
h1 { font-size: 20px; margin: 0 0 10px; }
h2 { font-size: 16px; margin: 28px 0 10px; border-bottom: 1px solid var(--line);
     padding-bottom: 4px; }
h3 { font-size: 13px; margin: 14px 0 6px; text-transform: uppercase; letter-spacing: .04em;
     color: var(--muted); }
code, td { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace;
           font-size: 12.5px; }
.verdict { padding: 12px 14px; border-radius: 6px; border-left: 6px solid; background: #fff;
           word-break: break-word; }
.verdict.diverged { border-color: var(--fail); }
.verdict.parity { border-color: var(--pass); }
.verdict.diverged strong { color: var(--fail); }
.verdict.parity strong { color: var(--pass); }
.warnings { background: #fff8c5; border: 1px solid #d4a72c; border-radius: 6px;
            padding: 8px 8px 8px 28px; }
.note { background: #ddf4ff; border-radius: 6px; padding: 8px 12px; }
.muted { color: var(--muted); }
.small { font-size: 12px; margin: 6px 0 0; }
.reasons { list-style: none; padding: 0; }
.reasons li { background: #fff; border: 1px solid var(--line); border-radius: 6px;
              padding: 6px 12px; margin-bottom: 8px; }
.reasons p { margin: 2px 0; }
.cards { display: grid; grid-template-columns: repeat(auto-fit, minmax(300px, 1fr)); gap: 12px;
         align-items: start; margin-top: 16px; }
.card { background: #fff; border: 1px solid var(--line); border-radius: 6px; padding: 4px 12px 10px;
        overflow-wrap: break-word; min-width: 0; }
.card dl { margin: 0; }
/* Neither a term nor a value may push the card wider than its grid column, so
   that long values (a platform, a path) wrap inside the card instead of running past it. */
dl { display: grid; grid-template-columns: minmax(0, max-content) minmax(0, 1fr);
     gap: 2px 12px; }
dt { color: var(--muted); }
dd { margin: 0; min-width: 0; }
.chart { width: 100%; height: auto; background: #fff; border: 1px solid var(--line);
         border-radius: 6px; }
.chart .grid { stroke: #eaeef2; }
.chart .axis { stroke: #8c959f; }
.chart .tick { font-size: 12px; fill: var(--muted); }
.chart .exponent { font-size: 9px; }
.chart .axis-title { font-size: 12px; fill: var(--muted); }
.chart .band { fill: var(--pass); opacity: .06; }
.chart .atol { stroke: var(--pass); stroke-width: 1.5; stroke-dasharray: 6 4; }
.chart .atol-label { font-size: 12px; fill: var(--pass); }
.chart .trace { fill: none; stroke: #8c959f; stroke-width: 1; }
.chart .point { stroke: #fff; stroke-width: 1; }
.chart .point.pass { fill: var(--pass); }
.chart .point.fail { fill: var(--fail); }
.chart .point.no-figure { fill: #fff; stroke: var(--fail); stroke-width: 2; }
.chart a:hover .point { stroke: #1f2328; stroke-width: 2; }
.chart .culprit-guide { stroke: var(--fail); stroke-dasharray: 3 3; }
.chart .culprit-ring { fill: none; stroke: var(--fail); stroke-width: 2; }
.chart .culprit-label { font-size: 12px; font-weight: 600; fill: var(--fail); }
.legend { color: var(--muted); font-size: 12px; }
.swatch.pass { color: var(--pass); }
.swatch.fail { color: var(--fail); }
.controls { display: flex; gap: 12px; align-items: center; margin-bottom: 8px; }
.controls input { width: 320px; padding: 5px 8px; border: 1px solid var(--line);
                  border-radius: 6px; font: inherit; }
table { border-collapse: collapse; background: #fff; border: 1px solid var(--line); }
/* Fixed layout: the figure columns keep their widths, the names share the rest and wrap
   (break-word breaks a long one only in a fixed layout), so the status stays in view. */
table.records { width: 100%; table-layout: fixed; }
table.records th { white-space: normal; }
th, td { padding: 4px 8px; border-bottom: 1px solid #eaeef2; text-align: left;
         vertical-align: top; }
th { background: #f6f8fa; font-weight: 600; white-space: nowrap; }
table.sortable th { cursor: pointer; user-select: none; }
table.sortable th:hover { background: #eaeef2; }
th[aria-sort="ascending"]::after { content: " ▲"; }
th[aria-sort="descending"]::after { content: " ▼"; }
/* Figures, op types, shapes and statuses never wrap ("2.48e+01", "ReduceSum"); names wrap
   after their separators (<wbr>), and a table wider than the page scrolls on its own. */
td.fig { white-space: nowrap; }
td.name { overflow-wrap: break-word; }
.scroll { overflow-x: auto; }
tr.gap td { color: var(--muted); font-style: italic; text-align: center; }
tr.first-divergence td { background: var(--mark); font-weight: 600; }
tr.culprit td { background: #ffe0e0; font-weight: 600; }
tr:target td { outline: 2px solid #0969da; outline-offset: -2px; }
.status-pass { color: var(--pass); }
td[class^="status-"]:not(.status-pass) { color: var(--fail); font-weight: 600; }
"""

SCRIPT = """
(function () {
  function compare(a, b, numeric) {
    if (numeric) { a = parseFloat(a); b = parseFloat(b); return a < b ? -1 : a > b ? 1 : 0; }
    return a.localeCompare(b);
  }
  document.querySelectorAll("table.sortable").forEach(function (table) {
    var headers = table.querySelectorAll("th");
    headers.forEach(function (header, column) {
      header.addEventListener("click", function () {
        var ascending = header.getAttribute("aria-sort") !== "ascending";
        var numeric = header.dataset.type === "number";
        headers.forEach(function (other) { other.removeAttribute("aria-sort"); });
        header.setAttribute("aria-sort", ascending ? "ascending" : "descending");
        var body = table.tBodies[0];
        var rows = Array.prototype.slice.call(body.rows);
        rows.sort(function (x, y) {
          var order = compare(x.cells[column].dataset.sort, y.cells[column].dataset.sort, numeric);
          return ascending ? order : -order;
        });
        rows.forEach(function (row) { body.appendChild(row); });
      });
    });
  });
  var filter = document.getElementById("filter");
  if (filter) {
    filter.addEventListener("input", function () {
      var query = filter.value.toLowerCase();
      var rows = document.getElementById("comparisons").tBodies[0].rows;
      var shown = 0;
      Array.prototype.forEach.call(rows, function (row) {
        var match = row.textContent.toLowerCase().indexOf(query) !== -1;
        row.hidden = !match;
        if (match) { shown += 1; }
      });
      document.getElementById("filter-count").textContent =
        shown + " of " + rows.length + " rows";
    });
  }
})();
"""
