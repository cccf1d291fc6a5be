// gpumedic console: live parts without reloading, and charts. /live says when something changed
// (server-sent events); then the page is fetched again and every element marked data-live is
// swapped for its new copy, so forms and scrolling stay as they are. Charts are JSON beside their
// figures, drawn with uPlot (served from /static/vendor). No framework, nothing from elsewhere.
(function () {
  "use strict";
  const state = document.getElementById("live-state");
  const COLOURS = ["#2563eb", "#dc2626", "#16a34a", "#d97706", "#7c3aed", "#0891b2", "#db2777", "#65a30d", "#475569", "#ea580c"];
  let busy = false;
  let again = false;

  // --- charts ---------------------------------------------------------------------------------

  function formatValue(v, unit) {
    if (v === null || v === undefined) { return "–"; }
    const abs = Math.abs(v);
    const text = abs >= 100 ? v.toFixed(0) : abs >= 10 ? v.toFixed(1) : v.toFixed(2);
    return unit ? text + " " + unit : text;
  }

  function utc(seconds) { return uPlot.tzDate(new Date(seconds * 1000), "Etc/UTC"); }

  function marksPlugin(marks) {
    return { hooks: { draw: [function (u) {
      const ctx = u.ctx;
      ctx.save();
      ctx.strokeStyle = "#b91c1c";
      ctx.fillStyle = "#b91c1c";
      ctx.setLineDash([6, 4]);
      ctx.lineWidth = 1.5 * devicePixelRatio;
      ctx.font = (11 * devicePixelRatio) + "px sans-serif";
      let textEnd = -Infinity, row = 0;
      marks.forEach(function (m) {
        const x = Math.round(u.valToPos(m.at, "x", true));
        if (x < u.bbox.left || x > u.bbox.left + u.bbox.width) { return; }
        ctx.beginPath();
        ctx.moveTo(x, u.bbox.top);
        ctx.lineTo(x, u.bbox.top + u.bbox.height);
        ctx.stroke();
        // a label that would overlap the one before (an incident of a few seconds) goes a line lower
        const left = x + 4 * devicePixelRatio;
        row = left < textEnd ? row + 1 : 0;
        ctx.fillText(m.label, left, u.bbox.top + (12 + 13 * row) * devicePixelRatio);
        textEnd = Math.max(textEnd, left + ctx.measureText(m.label).width + 4 * devicePixelRatio);
      });
      ctx.restore();
    }] } };
  }

  function drawCharts(root) {
    root.querySelectorAll("[data-charts]").forEach(function (group) {
      const script = group.querySelector("script.chart-data");
      if (!script || group.dataset.drawn) { return; }
      group.dataset.drawn = "1";
      if (!window.uPlot) {
        const note = document.createElement("p");
        note.className = "error";
        note.textContent = "The charts need uPlot in static/vendor: run `make install` (it fetches it from the npm registry).";
        group.prepend(note);
        return;
      }
      const charts = JSON.parse(script.textContent);
      const plots = [];
      let syncing = false;
      const link = group.querySelector("a.zoomed-window");
      charts.forEach(function (chart) {
        const box = group.querySelector('[data-chart="' + chart.id + '"] .plot');
        if (!box) { return; }
        const unit = chart.unit;
        const series = [{ label: "time (UTC)", value: function (u, v) { return v == null ? "–" : uPlot.fmtDate("{YYYY}-{MM}-{DD} {HH}:{mm}")(utc(v)); } }];
        chart.series.forEach(function (s, i) {
          // a few points in a long window would be lines too short to see: they are drawn as dots
          const few = s.values.filter(function (v) { return v !== null; }).length < 60;
          const colour = COLOURS[i % COLOURS.length];
          series.push({ label: s.label, stroke: colour, width: 1.5, spanGaps: false, points: { show: few, size: 6, fill: colour },
                        value: function (u, v) { return formatValue(v, unit); } });
        });
        const opts = {
          width: Math.max(280, box.clientWidth || 600),
          height: 200,
          tzDate: utc,
          series: series,
          cursor: { sync: { key: group.id }, drag: { x: true, y: false } },
          scales: { x: { time: true } },
          axes: [
            { label: "time (UTC)", labelSize: 18, stroke: "#475569", grid: { stroke: "#e2e8f0" } },
            { label: unit || chart.title, labelSize: 18, stroke: "#475569", grid: { stroke: "#e2e8f0" }, size: 56,
              values: function (u, ticks) { return ticks.map(function (t) { return formatValue(t, ""); }); } },
          ],
          plugins: chart.marks && chart.marks.length ? [marksPlugin(chart.marks)] : [],
          hooks: { setScale: [function (u, key) {
            if (key !== "x" || syncing) { return; }
            syncing = true;
            const min = u.scales.x.min, max = u.scales.x.max;
            plots.forEach(function (other) { if (other !== u) { other.setScale("x", { min: min, max: max }); } });
            syncing = false;
            const full = chart.times.length && min <= chart.times[0] && max >= chart.times[chart.times.length - 1];
            group.dataset.zoomed = full ? "" : "1";
            if (link) {
              link.hidden = full;
              const url = new URL(window.location.href);
              url.searchParams.delete("window");
              url.searchParams.set("from", new Date(min * 1000).toISOString().slice(0, 16));
              url.searchParams.set("to", new Date(max * 1000).toISOString().slice(0, 16));
              link.href = url.pathname + url.search + "#" + group.id;
            }
          }] },
        };
        const data = [chart.times].concat(chart.series.map(function (s) { return s.values; }));
        const plot = new uPlot(opts, data, box);
        plots.push(plot);
        box.uplot = plot;  // what it draws with, for a look from the browser's console (and the tests)
        box.dataset.ready = "1";
      });
      if (window.ResizeObserver) {
        new ResizeObserver(function () {
          plots.forEach(function (p) {
            const width = Math.max(280, p.root.parentElement.clientWidth);
            if (Math.abs(width - p.width) > 2) { p.setSize({ width: width, height: 200 }); }
          });
        }).observe(group);
      }
    });
  }

  // --- live parts -----------------------------------------------------------------------------

  async function refresh() {
    if (busy) { again = true; return; }
    busy = true;
    try {
      const response = await fetch(window.location.href, { headers: { "Accept": "text/html" }, credentials: "same-origin" });
      if (!response.ok) { throw new Error("HTTP " + response.status); }
      const fresh = new DOMParser().parseFromString(await response.text(), "text/html");
      document.querySelectorAll("[data-live][id]").forEach(function (old) {
        const replacement = fresh.getElementById(old.id);
        if (!replacement || replacement.innerHTML === old.innerHTML) { return; }
        if (old.querySelector("[data-charts][data-zoomed='1']")) { return; }  // keep what the operator zoomed into
        const copy = document.importNode(replacement, true);
        old.replaceWith(copy);
        drawCharts(copy);
      });
      document.body.dataset.refreshed = String(Date.now());
      if (state) { state.textContent = "live"; state.title = "updated " + new Date().toLocaleTimeString(); }
    } catch (error) {
      if (state) { state.textContent = "live (retrying)"; state.title = String(error); }
    } finally {
      busy = false;
      if (again) { again = false; refresh(); }
    }
  }

  drawCharts(document);
  if (!document.querySelector("[data-live]")) { return; }
  if (window.EventSource) {
    const source = new EventSource("/live");
    source.addEventListener("change", refresh);
    source.onerror = function () { if (state) { state.textContent = "live (reconnecting)"; } };
    source.onopen = function () { if (state) { state.textContent = "live"; } };
  } else {
    window.setInterval(refresh, 5000);  // no server-sent events: poll
  }
})();
