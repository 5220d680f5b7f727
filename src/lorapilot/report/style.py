"""The report page's stylesheet, inlined into its <style> element (the page loads nothing)."""

CSS = """
:root { --ink:#1f2328; --muted:#59636e; --line:#d1d9e0; --bg:#f6f8fa; }
* { box-sizing: border-box; }
body { margin:0; color:var(--ink); background:#fff; font:15px/1.5 -apple-system, "Segoe UI",
  Roboto, "Helvetica Neue", Arial, sans-serif; }
main { max-width: 1100px; margin: 0 auto; padding: 24px 28px 64px; }
h1 { font-size: 1.8em; margin: 0 0 4px; }
h2 { font-size: 1.35em; margin: 36px 0 10px;
  padding-bottom: 4px; border-bottom: 1px solid var(--line); }
h3 { font-size: 1.05em; margin: 20px 0 6px; }
.meta { color: var(--muted); margin: 0 0 12px; }
nav ol { columns: 2; margin: 8px 0 0; padding-left: 22px; color: var(--muted); }
nav a { color: #0969da; text-decoration: none; }
table { border-collapse: collapse; margin: 8px 0 12px; font-size: 0.9em; }
th, td { border: 1px solid var(--line); padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: var(--bg); font-weight: 600; }
td { font-variant-numeric: tabular-nums; overflow-wrap: anywhere; }
table.kv th { width: 16em; }
.scroll { overflow-x: auto; }
.banner { font-size: 3em; font-weight: 800; letter-spacing: 0.04em; padding: 10px 22px;
  border-radius: 8px; display: inline-block; margin: 6px 0 10px; border: 3px solid; }
.GO { color: #1a7f37; background: #dafbe1; border-color: #1a7f37; }
.NO-GO { color: #cf222e; background: #ffebe9; border-color: #cf222e; }
.INCONCLUSIVE { color: #9a6700; background: #fff8c5; border-color: #9a6700; }
.NONE { color: var(--muted); background: var(--bg); border-color: var(--line); font-size: 2em; }
.good { color: #1a7f37; font-weight: 600; } .bad { color: #cf222e; font-weight: 600; }
.notrun { color: var(--muted); font-style: italic;
  background: var(--bg); padding: 6px 10px; border-radius: 4px; }
.warn { background: #fff8c5; padding: 6px 10px; border-left: 4px solid #d4a72c; }
figure { margin: 10px 0 16px; }
figure img { max-width: 100%; height: auto; border: 1px solid var(--line); }
figcaption { color: var(--muted); font-size: 0.85em; }
@media print {
  body { font-size: 11pt; } main { max-width: none; padding: 0; } nav { display: none; }
  h2 { break-after: avoid; } table, figure, .banner { break-inside: avoid; }
  .scroll { overflow: visible; } a { color: inherit; }
}
"""
