// ramjet dashboard: polls data.json and draws it with uPlot (line charts)
// and small SVG bar charts. No external resources; everything is served
// from the ramjet binary.
(function () {
  "use strict";

  var PALETTE = ["#58a6ff", "#3fb950", "#d29922", "#f778ba", "#bc8cff", "#39c5cf",
    "#ff7b72", "#a5d6ff", "#7ee787", "#e3b341", "#ffa198", "#d2a8ff"];
  var REASONS = ["affinity", "load_override", "cold", "tie_break", "fallback", "panic", "none"];
  var REASON_COLORS = { affinity: "#3fb950", load_override: "#d29922", cold: "#58a6ff",
    tie_break: "#bc8cff", fallback: "#8493a3", panic: "#ff7b72", none: "#f85149" };

  var charts = {};
  var updates = 0;
  var pollMs = 2000;
  var last = null;

  function $(id) { return document.getElementById(id); }

  // ---- formatting ----
  function fmt(v, digits) {
    if (v === null || v === undefined || !isFinite(v)) return "–";
    var a = Math.abs(v);
    if (a >= 1e9) return (v / 1e9).toFixed(1) + "G";
    if (a >= 1e6) return (v / 1e6).toFixed(1) + "M";
    if (a >= 1e4) return (v / 1e3).toFixed(1) + "k";
    return v.toFixed(digits === undefined ? (a < 10 ? 2 : 1) : digits);
  }
  function pct(v) { return v === null || v === undefined || !isFinite(v) ? "–" : (v * 100).toFixed(1) + "%"; }
  function bytes(v) {
    if (!isFinite(v)) return "–";
    if (v >= 1 << 30) return (v / (1 << 30)).toFixed(2) + " GiB";
    if (v >= 1 << 20) return (v / (1 << 20)).toFixed(1) + " MiB";
    if (v >= 1 << 10) return (v / (1 << 10)).toFixed(1) + " KiB";
    return v + " B";
  }
  function secs(v) { return v === null || !isFinite(v) ? "–" : v < 1 ? (v * 1000).toFixed(0) + " ms" : v.toFixed(2) + " s"; }
  function lastFinite(a) {
    if (!a) return null;
    for (var i = a.length - 1; i >= 0; i--) if (a[i] !== null && isFinite(a[i])) return a[i];
    return null;
  }
  function windowRatio(num, den) {
    var n = 0, d = 0;
    for (var i = 0; i < num.length; i++) { if (num[i] !== null) n += num[i]; if (den[i] !== null) d += den[i]; }
    return d > 0 ? n / d : null;
  }
  function shortId(id) { return id ? id.slice(0, 8) : "–"; }

  // ---- line charts (uPlot) ----
  // series: [{label, color, values, fill?, dash?}]; yfmt formats axis values.
  function lineChart(id, xs, series, yfmt, yrange) {
    var el = $(id);
    var key = series.map(function (s) { return s.label; }).join("|");
    var data = [xs].concat(series.map(function (s) { return s.values; }));
    var points = 0, maxv = 0;
    series.forEach(function (s) {
      s.values.forEach(function (v) { if (v !== null && isFinite(v)) { points++; if (v > maxv) maxv = v; } });
    });
    el.dataset.points = points;
    el.dataset.max = maxv;
    el.dataset.series = series.length;
    var c = charts[id];
    var width = Math.max(200, el.clientWidth || 440);
    if (c && c.key === key) {
      c.u.setData(data);
      if (Math.abs(c.u.width - width) > 4) c.u.setSize({ width: width, height: 190 });
      return;
    }
    if (c) { c.u.destroy(); }
    el.textContent = "";
    var opts = {
      width: width, height: 190,
      cursor: { drag: { x: false, y: false } },
      legend: { show: true, live: false },
      scales: { x: { time: true }, y: yrange ? { range: yrange } : { auto: true, range: function (u, mn, mx) { return [0, Math.max(mx * 1.1, 1e-9)]; } } },
      axes: [
        { stroke: "#8493a3", grid: { stroke: "#222a33" }, ticks: { stroke: "#273039" }, space: 70,
          incrs: [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600],
          values: function (u, vals) {
            return vals.map(function (v) { return new Date(v * 1000).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit" }); });
          } },
        { stroke: "#8493a3", grid: { stroke: "#222a33" }, ticks: { stroke: "#273039" }, size: 70,
          values: function (u, vals) { return vals.map(yfmt); } }
      ],
      series: [{}].concat(series.map(function (s) {
        return { label: s.label, stroke: s.color, width: 1.6, fill: s.fill || undefined,
          dash: s.dash || undefined, spanGaps: false, points: { show: false },
          value: function (u, v) { return v === null ? "–" : yfmt(v); } };
      }))
    };
    charts[id] = { key: key, u: new uPlot(opts, data, el) };
  }

  // ---- bar charts (SVG) ----
  var SVGNS = "http://www.w3.org/2000/svg";
  function svgEl(name, attrs, text) {
    var e = document.createElementNS(SVGNS, name);
    for (var k in attrs) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    return e;
  }
  // items: [{label, segments: [{value, color, title}], text}]; max: full scale.
  function barChart(id, items, max) {
    var el = $(id);
    el.textContent = "";
    el.dataset.items = items.length;
    var total = 0;
    items.forEach(function (it) { it.segments.forEach(function (s) { total += s.value; }); });
    el.dataset.total = total;
    if (!items.length) {
      var d = document.createElement("div"); d.className = "empty"; d.textContent = "no data yet"; el.appendChild(d);
      return;
    }
    var width = Math.max(240, el.clientWidth || 440), row = 24, labelW = 90, textW = 190;
    var barW = width - labelW - textW - 10;
    var svg = svgEl("svg", { width: width, height: items.length * row + 4, role: "img" });
    items.forEach(function (it, i) {
      var y = i * row + 4;
      svg.appendChild(svgEl("text", { x: 0, y: y + 13, "class": "axis" }, it.label));
      svg.appendChild(svgEl("rect", { x: labelW, y: y, width: barW, height: 16, fill: "#1e252d", rx: 3 }));
      var x = labelW;
      it.segments.forEach(function (s) {
        var w = max > 0 ? Math.max(0, Math.min(barW, barW * s.value / max)) : 0;
        if (w <= 0) return;
        var r = svgEl("rect", { x: x, y: y, width: w, height: 16, fill: s.color, rx: 3, "data-value": s.value });
        if (s.title) r.appendChild(svgEl("title", {}, s.title));
        svg.appendChild(r);
        x += w;
      });
      svg.appendChild(svgEl("text", { x: labelW + barW + 8, y: y + 13 }, it.text));
    });
    el.appendChild(svg);
  }

  function healthColor(u) {
    if (u.available) return "#3fb950";
    if (u.quarantined) return "#d29922";
    return "#f85149";
  }
  function healthWord(u) { return u.available ? "up" : u.quarantined ? "quarantined" : u.healthy ? "unavailable" : "down"; }

  // ---- rendering ----
  function render(d) {
    last = d;
    if (d.interval_seconds) pollMs = Math.max(500, Math.min(10000, d.interval_seconds * 1000));
    var xs = d.t || [];
    var sys = d.system || { rps: [], eps: [], output_tps: [], cached_share: [] };
    var ups = d.upstreams || [], models = d.models || [];

    // Header.
    var h = $("health");
    h.className = "badge " + d.health.status;
    h.textContent = d.health.status + " · " + d.health.usable + "/" + d.health.upstreams + " replicas";
    $("updated").textContent = "live · " + new Date(d.now * 1000).toLocaleTimeString() + " · every " + (pollMs / 1000) + "s";

    // Tiles.
    $("k-rps").textContent = fmt(lastFinite(sys.rps));
    $("k-eps").textContent = fmt(lastFinite(sys.eps));
    $("k-cached").textContent = pct(d.totals.cached_share);
    $("k-ttft").textContent = secs(lastFinite(d.ttft_p50)) + " / " + secs(lastFinite(d.ttft_p95));
    $("k-tps").textContent = fmt(lastFinite(sys.output_tps));
    var ib = lastFinite(d.index_bytes), ibud = lastFinite(d.index_budget);
    $("k-index").textContent = ib === null ? "–" : bytes(ib) + (ibud ? " (" + pct(ib / ibud) + ")" : "");

    // Overview charts.
    lineChart("c-rps", xs, [
      { label: "requests/s", color: "#58a6ff", values: sys.rps, fill: "rgba(88,166,255,.12)" },
      { label: "errors/s", color: "#f85149", values: sys.eps }
    ], function (v) { return fmt(v); });
    lineChart("c-cached", xs, [
      { label: "cached share", color: "#3fb950", values: sys.cached_share, fill: "rgba(63,185,80,.12)" }
    ], pct, [0, 1]);
    lineChart("c-ttft", xs, [
      { label: "p50", color: "#58a6ff", values: d.ttft_p50 || [] },
      { label: "p95", color: "#d29922", values: d.ttft_p95 || [] }
    ], secs);
    lineChart("c-load", xs, ups.map(function (u, i) {
      return { label: shortId(u.id), color: PALETTE[i % PALETTE.length], values: u.inflight_series || [] };
    }), function (v) { return fmt(v, 0); });
    var maxLoad = 1;
    ups.forEach(function (u) { maxLoad = Math.max(maxLoad, u.inflight); });
    barChart("b-health", ups.map(function (u) {
      return { label: shortId(u.id), segments: [{ value: u.inflight, color: healthColor(u), title: healthWord(u) }],
        text: u.inflight + " in flight · " + fmt(u.pending_prefill_tokens, 0) + " prefill · " + healthWord(u) };
    }), maxLoad);
    lineChart("c-index", xs, [
      { label: "index bytes", color: "#bc8cff", values: d.index_bytes || [], fill: "rgba(188,140,255,.12)" },
      { label: "budget", color: "#8493a3", values: d.index_budget || [], dash: [6, 4] }
    ], bytes);

    // Serving: per replica.
    lineChart("c-up-tps", xs, ups.map(function (u, i) {
      return { label: shortId(u.id), color: PALETTE[i % PALETTE.length], values: u.output_tps || [] };
    }), function (v) { return fmt(v); });
    barChart("b-up-cached", ups.map(function (u, i) {
      var s = u.cached_share;
      return { label: shortId(u.id), segments: [{ value: s === null ? 0 : s, color: PALETTE[i % PALETTE.length] }],
        text: pct(s) + " of " + fmt(u.requests, 0) + " req" };
    }), 1);
    var maxReasons = 0;
    ups.forEach(function (u) {
      var t = 0; for (var r in u.reasons) t += u.reasons[r]; maxReasons = Math.max(maxReasons, t);
    });
    barChart("b-up-reasons", ups.map(function (u) {
      var t = 0, segs = REASONS.filter(function (r) { return u.reasons[r] > 0; }).map(function (r) {
        t += u.reasons[r];
        return { value: u.reasons[r], color: REASON_COLORS[r], title: r + ": " + u.reasons[r] };
      });
      var top = REASONS.filter(function (r) { return u.reasons[r] > 0; })
        .map(function (r) { return r.replace("_", " ") + " " + Math.round(100 * u.reasons[r] / t) + "%"; })
        .slice(0, 1).join(", ");
      return { label: shortId(u.id), segments: segs, text: t ? top : "–" };
    }), maxReasons);
    var reasonSeries = REASONS.filter(function (r) { return d.reasons && d.reasons[r]; }).map(function (r) {
      return { label: r, color: REASON_COLORS[r], values: d.reasons[r] };
    });
    lineChart("c-reasons", xs, reasonSeries, function (v) { return fmt(v); });

    // Serving: per model.
    lineChart("c-model-inflight", xs, models.map(function (m, i) {
      return { label: m.model, color: PALETTE[i % PALETTE.length], values: m.inflight_series || [] };
    }), function (v) { return fmt(v, 0); });
    lineChart("c-model-tps", xs, models.map(function (m, i) {
      return { label: m.model, color: PALETTE[i % PALETTE.length], values: m.output_tps || [] };
    }), function (v) { return fmt(v); });
    barChart("b-model-cached", models.map(function (m, i) {
      var s = m.cached_share;
      return { label: m.model.slice(0, 12), segments: [{ value: s === null ? 0 : s, color: PALETTE[i % PALETTE.length] }],
        text: pct(s) + " · " + m.inflight + " in flight" };
    }), 1);

    renderRecent(d.recent || []);
    updates++;
    document.body.dataset.updates = updates;
    document.body.dataset.requests = d.totals.requests;
  }

  function td(tr, text, cls) {
    var c = document.createElement("td");
    c.textContent = text;
    if (cls) c.className = cls;
    tr.appendChild(c);
  }
  function renderRecent(recent) {
    var tb = $("recent").tBodies[0];
    tb.textContent = "";
    recent.slice(0, 50).forEach(function (r) {
      var tr = document.createElement("tr");
      td(tr, new Date(r.time_ms).toLocaleTimeString());
      td(tr, shortId(r.upstream), "id");
      td(tr, r.model || "–");
      td(tr, r.reason.replace("_", " "), "r-" + r.reason);
      td(tr, r.tie || "–");
      td(tr, fmt(r.overlap_tokens, 0) + " / " + fmt(r.best_overlap_tokens, 0));
      td(tr, fmt(r.load_tokens, 0));
      td(tr, fmt(r.score, 0));
      td(tr, r.ttft_ms ? r.ttft_ms.toFixed(0) : "–");
      td(tr, r.prompt_tokens ? fmt(r.cached_prompt_tokens, 0) + "/" + fmt(r.prompt_tokens, 0) : "–");
      td(tr, r.outcome + " " + r.status, r.outcome === "ok" ? "" : "o-bad");
      tb.appendChild(tr);
    });
  }

  // ---- tabs, polling ----
  function showTab(name) {
    Array.prototype.forEach.call(document.querySelectorAll(".tab"), function (b) {
      b.classList.toggle("active", b.dataset.tab === name);
    });
    Array.prototype.forEach.call(document.querySelectorAll(".page"), function (p) {
      p.classList.toggle("active", p.id === "page-" + name);
    });
    if (last) render(last); // size the charts of the page now shown
  }
  Array.prototype.forEach.call(document.querySelectorAll(".tab"), function (b) {
    b.addEventListener("click", function () { location.hash = b.dataset.tab; showTab(b.dataset.tab); });
  });
  if (location.hash === "#serving") showTab("serving");

  function poll() {
    fetch("data.json", { cache: "no-store" })
      .then(function (r) { if (!r.ok) throw new Error("HTTP " + r.status); return r.json(); })
      .then(render)
      .catch(function (e) { $("updated").textContent = "disconnected: " + e.message; })
      .then(function () { setTimeout(poll, pollMs); });
  }
  window.addEventListener("resize", function () { if (last) render(last); });
  poll();
})();
