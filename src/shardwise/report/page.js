// The report page: a sortable, filterable table of the planner's layouts, stacked bars of their memory
// and step time (Chart.js), the winner's simulated pipeline step (a canvas), and a validation run.
// Everything is drawn from the JSON in #report-data; nothing is fetched.
"use strict";
(function () {
  const DATA = JSON.parse(document.getElementById("report-data").textContent);
  const $ = (id) => document.getElementById(id);
  const esc = (s) => String(s).replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" }[c]));
  // null: a value that has none (a rank correlation over one layout)
  const num = (x, d) => x == null ? "n/a" : Number(x).toLocaleString("en-US", { minimumFractionDigits: d, maximumFractionDigits: d });
  // Okabe-Ito and Tol colours: distinguishable with the common colour-vision deficiencies.
  const PALETTE = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#999999", "#332288", "#117733"];
  Chart.defaults.animation = false;
  Chart.defaults.font.family = getComputedStyle(document.body).fontFamily;
  Chart.defaults.color = "#1d2430";
  const api = { ready: false, charts: {} };
  window.shardwiseReport = api;

  // ------------------------------------------------------------------ plan: winner and explanation

  function initWinner(plan) {
    const w = plan.winner;
    const cards = [
      ["layout", w.describe], ["schedule", w.pp > 1 ? w.schedule : "no pipeline"], ["ZeRO", w.zero],
      ["recompute", w.recompute_layers ? `${w.recompute} (${w.recompute_layers} layers a stage)` : w.recompute],
      ["sequence parallel", w.sequence_parallel ? "yes" : "no"],
      ...(w.cp > 1 ? [["context parallelism", w.cp_mode]] : []),
      ["memory per GPU", `${num(w.memory_gib_per_gpu, 1)} of ${num(w.gpu_memory_gib, 0)} GiB`],
      ["step", `${num(w.step_time_s, w.step_time_s < 1 ? 4 : 2)} s`], ["tokens/s", num(w.tokens_per_s, 0)],
      ["MFU", `${num(100 * w.mfu, 1)} %`],
    ];
    $("winner-cards").innerHTML = cards.map(([k, v]) => `<div class="card"><div class="k">${esc(k)}</div><div class="v">${esc(v)}</div></div>`).join("");
    $("assumptions").textContent = "Assumes: " + plan.assumptions.join("; ") + ".";
    if (plan.emitted) {
      $("emitted").textContent = `Written for ${plan.emitted.title}: ${plan.emitted.path} (layout #${plan.emitted.rank}).`;
    }
    $("explain-list").innerHTML = plan.explanation.map((p) => `<li>${esc(p)}</li>`).join("");
  }

  // ------------------------------------------------------------------ plan: the table

  const COLUMNS = [
    { key: "rank", label: "#" }, { key: "layout", label: "layout", text: true }, { key: "dp", label: "dp" },
    { key: "tp", label: "tp" }, { key: "pp", label: "pp" }, { key: "cp", label: "cp" },
    { key: "cp_mode", label: "CP mode", text: true }, { key: "ep", label: "ep" }, { key: "vpp", label: "vpp" }, { key: "mb", label: "micro-batch" },
    { key: "m", label: "micro-batches" }, { key: "schedule", label: "schedule", text: true }, { key: "zero", label: "ZeRO" },
    { key: "recompute", label: "recompute", text: true }, { key: "sp", label: "SP", text: true },
    { key: "mem_gib", label: "GiB/GPU" }, { key: "step_s", label: "step s" }, { key: "tokens_per_s", label: "tokens/s" },
    { key: "mfu", label: "MFU" },
  ];
  const FILTERS = [["dp", "dp"], ["tp", "tp"], ["pp", "pp"], ["zero", "ZeRO"], ["recompute", "recompute"], ["schedule", "schedule"]];

  function tableRows(plan) {
    const L = plan.layouts;
    return L.rows.map((values, i) => {
      const r = { overall: i + 1, memory: L.memory[i], time: L.time[i] };
      L.columns.forEach((c, j) => { r[c] = values[j]; });
      r.sp = r.sp ? "yes" : "-";
      return r;
    });
  }

  function initTable(plan) {
    const all = tableRows(plan);
    const state = { sort: "rank", dir: 1, filters: {}, best: true, page: 0, size: 20 };
    api.state = state;
    const controls = $("filters");
    for (const [key, label] of FILTERS) {
      const values = [...new Set(all.map((r) => r[key]))].sort((a, b) => (typeof a === "number" ? a - b : String(a).localeCompare(String(b))));
      const el = document.createElement("label");
      el.innerHTML = `${esc(label)} <select data-filter="${key}"><option value="">all</option>` +
        values.map((v) => `<option value="${esc(v)}">${esc(v)}</option>`).join("") + "</select>";
      controls.appendChild(el);
    }
    controls.addEventListener("change", (ev) => {
      const t = ev.target;
      if (t.id === "best-of-split") state.best = t.checked;
      else if (t.dataset.filter) state.filters[t.dataset.filter] = t.value;
      state.page = 0;
      update();
    });
    $("layout-head").innerHTML = COLUMNS.map((c) => `<th data-key="${c.key}" class="${c.text ? "text" : ""}" title="sort by ${esc(c.label)}">${esc(c.label)}</th>`).join("");
    $("layout-head").addEventListener("click", (ev) => {
      const key = ev.target.closest("th") && ev.target.closest("th").dataset.key;
      if (!key) return;
      state.dir = state.sort === key ? -state.dir : 1;
      state.sort = key;
      state.page = 0;
      update();
    });
    $("prev").addEventListener("click", () => { state.page = Math.max(0, state.page - 1); update(); });
    $("next").addEventListener("click", () => { state.page += 1; update(); });
    $("page-size").addEventListener("change", (ev) => { state.size = Number(ev.target.value); state.page = 0; update(); });

    function visible() {
      let rows = all.filter((r) => !state.best || r.split_rank !== null);
      for (const [key, value] of Object.entries(state.filters)) {
        if (value !== "") rows = rows.filter((r) => String(r[key]) === value);
      }
      rows.forEach((r) => { r.rank = state.best ? r.split_rank : r.overall; });
      const k = state.sort;
      const text = COLUMNS.find((c) => c.key === k).text;
      return rows.slice().sort((a, b) => {
        const d = text ? String(a[k]).localeCompare(String(b[k])) : a[k] - b[k];
        return state.dir * (d || a.overall - b.overall);
      });
    }

    function cell(r, c) {
      const v = r[c.key];
      if (c.key === "mem_gib") return num(v, 1);
      if (c.key === "step_s") return v < 1 ? num(v, 4) : num(v, 2);
      if (c.key === "tokens_per_s") return num(v, 0);
      if (c.key === "mfu") return num(100 * v, 1) + "%";
      return esc(v);
    }

    function update() {
      const rows = visible();
      const size = state.size || rows.length || 1;
      const pages = Math.max(1, Math.ceil(rows.length / size));
      state.page = Math.min(state.page, pages - 1);
      const shown = rows.slice(state.page * size, state.page * size + size);
      $("layout-body").innerHTML = shown.map((r) => `<tr data-overall="${r.overall}"${r.overall === 1 ? ' class="winner"' : ""}>` +
        COLUMNS.map((c) => `<td class="${c.text ? "text" : ""}">${cell(r, c)}</td>`).join("") + "</tr>").join("");
      document.querySelectorAll("#layout-head th").forEach((th) => {
        th.setAttribute("aria-sort", th.dataset.key === state.sort ? (state.dir > 0 ? "ascending" : "descending") : "none");
      });
      const first = rows.length ? state.page * size + 1 : 0;
      $("page-info").textContent = `${first}–${state.page * size + shown.length} of ${rows.length} layouts` +
        (rows.length < all.length ? ` (${all.length} fit in all)` : "");
      $("prev").disabled = state.page === 0;
      $("next").disabled = state.page >= pages - 1;
      api.visible = rows;
      api.shown = shown;
      drawBars(plan, shown);
    }
    api.update = update;
    update();
  }

  // ------------------------------------------------------------------ plan: stacked bars

  const gpuLine = {
    id: "gpuLine",
    afterDatasetsDraw(chart, args, opts) {
      if (opts.value == null) return;
      const x = chart.scales.x.getPixelForValue(opts.value);
      const { top, bottom } = chart.chartArea;
      const ctx = chart.ctx;
      ctx.save();
      ctx.strokeStyle = "#C8102E"; ctx.lineWidth = 2; ctx.setLineDash([6, 4]);
      ctx.beginPath(); ctx.moveTo(x, top); ctx.lineTo(x, bottom); ctx.stroke();
      ctx.setLineDash([]); ctx.fillStyle = "#C8102E"; ctx.textAlign = "right"; ctx.textBaseline = "bottom";
      ctx.fillText(opts.label, x, top - 3);  // above the bars, in the padding reserved for it
      ctx.restore();
    },
  };

  function barChart(canvas, keys, title, unit, line) {
    const chart = new Chart(canvas, {
      type: "bar",
      data: { labels: [], datasets: keys.map(([key, label, color]) => ({ label, key, data: [], backgroundColor: color, borderWidth: 0 })) },
      options: {
        indexAxis: "y", responsive: true, maintainAspectRatio: false, layout: { padding: { top: line ? 16 : 0 } },
        scales: { x: { stacked: true, beginAtZero: true, title: { display: true, text: unit } }, y: { stacked: true, ticks: { autoSkip: false, font: { size: 11 } } } },
        plugins: {
          title: { display: true, text: title, align: "start", font: { size: 14, weight: "600" } },
          legend: { position: "bottom", labels: { boxWidth: 12 } },
          tooltip: { mode: "index", intersect: false, callbacks: { footer: (items) => `total ${num(items.reduce((s, it) => s + it.parsed.x, 0), 3)} ${unit.split(" ")[0]}` } },
          gpuLine: line || {},
        },
      },
      plugins: [gpuLine],
    });
    return chart;
  }

  function drawBars(plan, shown) {
    const L = plan.layouts;
    if (!api.charts.memory) {
      api.charts.memory = barChart($("memory-chart"), L.memory_keys, "Memory per GPU (worst pipeline rank)", "GiB per GPU",
        { value: plan.gpu_memory_gib, label: `GPU memory ${num(plan.gpu_memory_gib, 0)} GiB` });
      api.charts.time = barChart($("time-chart"), L.time_keys, "Step time", "seconds per step");
    }
    const labels = shown.map((r) => `#${r.rank} ${r.layout}`);
    const height = Math.max(160, 24 * shown.length + 110) + "px";
    for (const [name, parts] of [["memory", "memory"], ["time", "time"]]) {
      const chart = api.charts[name];
      chart.canvas.parentNode.style.height = height;
      chart.data.labels = labels;
      chart.data.datasets.forEach((ds, i) => { ds.data = shown.map((r) => r[parts][i]); });
      if (name === "memory") {
        const top = Math.max(plan.gpu_memory_gib, ...shown.map((r) => r.mem_gib));
        chart.options.scales.x.suggestedMax = top * 1.04;
      }
      chart.resize();
      chart.update();
    }
  }

  // ------------------------------------------------------------------ plan: the winner's timeline

  function shade(hex, chunk, chunks) {
    const mix = chunks > 1 ? 0.5 * chunk / (chunks - 1) : 0;
    const c = [1, 3, 5].map((i) => parseInt(hex.slice(i, i + 2), 16));
    return `rgb(${c.map((v) => Math.round(v + (255 - v) * mix)).join(",")})`;
  }

  function timelineEvents(t) {
    return t.ranks.map((rank, r) => {
      const out = [];
      let end = 0;
      for (let i = 0; i < rank.kind.length; i++) {
        const kind = rank.kind[i], chunk = rank.chunk[i];
        const start = end + rank.gap[i];
        end = start + t.duration_s[kind][chunk * t.pp + r];
        out.push({ kind, mb: rank.mb[i], chunk, start, end });
      }
      return out;
    });
  }

  function initTimeline(plan) {
    const t = plan.timeline;
    if (!t || t.omitted) {
      $("timeline-note").textContent = t ? t.omitted : "The winner has no pipeline (pp = 1): every GPU runs the whole model, so there is no pipeline timeline.";
      $("timeline-canvas").hidden = true;
      return;
    }
    const events = timelineEvents(t);
    const makespan = Math.max(...events.map((evs) => (evs.length ? evs[evs.length - 1].end : 0)));
    api.timeline = { events, makespan };
    $("timeline-note").textContent = `${t.schedule}` + (t.lockstep ? " in lockstep (DeepSpeed's TrainSchedule: every exchange blocks both stages)" : "") +
      `, ${t.pp} ranks` + (t.vpp > 1 ? ` × ${t.vpp} model chunks` : "") +
      `, ${t.m} micro-batches: the schedule shardwise simulates, timed with the planner's per micro-batch costs ` +
      `(slowest stage: forward ${num(1e3 * t.costs_s.f, 2)} ms, backward ${num(1e3 * (t.costs_s.b + t.costs_s.w), 2)} ms; the others at their own cost; ` +
      `transfer ${num(1e3 * t.costs_s.transfer, 3)} ms). Pipeline span ${num(makespan, 3)} s, the busiest rank idle ${num(100 * t.bubble_fraction, 1)} % of it (waits for transfers included; the table's pipeline_bubble leaves transfers to pp_p2p). ` +
      "Hover for details; drag across the chart to zoom in, double-click to see the whole step.";
    $("timeline-legend").innerHTML = Object.keys(t.colors).map((k) => `<span><i style="background:${t.colors[k]}"></i>${esc(t.labels[k])}</span>`).join("") +
      (t.vpp > 1 ? `<span><i style="background:${shade(t.colors.F, 1, 2)}"></i>lighter: later model chunk</span>` : "") +
      `<span><i style="background:#eef0f3"></i>idle (bubble)</span>`;
    const canvas = $("timeline-canvas");
    const left = 64, right = 16, top = 8, axis = 28;
    const rowH = Math.max(8, Math.min(26, Math.floor(560 / t.pp)));
    const view = { t0: 0, t1: makespan };  // drag to zoom into a time window, double-click for the whole step
    let drag = null;
    const x0 = () => left, width = () => canvas.parentNode.clientWidth || 1000;
    const scale = () => (width() - left - right) / (view.t1 - view.t0);
    const timeAt = (x) => view.t0 + (x - left) / scale();
    function draw() {
      const w = width(), height = top + rowH * t.pp + axis;
      const dpr = window.devicePixelRatio || 1;
      canvas.width = w * dpr; canvas.height = height * dpr; canvas.style.height = height + "px";
      const ctx = canvas.getContext("2d");
      ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
      ctx.clearRect(0, 0, w, height);
      const k = scale(), span = view.t1 - view.t0;
      ctx.font = "12px " + Chart.defaults.font.family;
      ctx.textBaseline = "middle";
      events.forEach((evs, r) => {
        const y = top + r * rowH;
        ctx.fillStyle = "#eef0f3";
        ctx.fillRect(x0(), y + 1, span * k, rowH - 2);
        ctx.save();
        ctx.beginPath(); ctx.rect(x0(), y, span * k, rowH); ctx.clip();
        for (const e of evs) {
          if (e.end < view.t0 || e.start > view.t1) continue;
          ctx.fillStyle = shade(t.colors[e.kind], e.chunk, t.vpp);
          ctx.fillRect(x0() + (e.start - view.t0) * k, y + 1, Math.max((e.end - e.start) * k, 0.6), rowH - 2);
        }
        ctx.restore();
        if (rowH >= 10 || r % Math.ceil(10 / rowH) === 0) {
          ctx.fillStyle = "#5b6575"; ctx.textAlign = "right";
          ctx.fillText(`rank ${r}`, left - 6, y + rowH / 2);
        }
      });
      const ticks = 8, y0 = top + rowH * t.pp;
      ctx.strokeStyle = "#9aa3b2"; ctx.fillStyle = "#5b6575"; ctx.textAlign = "center";
      const digits = Math.max(0, Math.min(6, 2 - Math.floor(Math.log10(span / ticks))));
      for (let i = 0; i <= ticks; i++) {
        const x = x0() + (i / ticks) * span * k;
        ctx.beginPath(); ctx.moveTo(x, y0); ctx.lineTo(x, y0 + 4); ctx.stroke();
        ctx.fillText(`${num(view.t0 + (i / ticks) * span, digits)} s`, x, y0 + 14);
      }
      if (drag && Math.abs(drag.x1 - drag.x0) > 2) {
        ctx.fillStyle = "rgba(11, 107, 203, 0.15)";
        ctx.fillRect(Math.min(drag.x0, drag.x1), top, Math.abs(drag.x1 - drag.x0), rowH * t.pp);
      }
    }
    api.timeline.view = view;
    api.timeline.draw = draw;
    draw();
    window.addEventListener("resize", draw);
    const tip = $("timeline-tip");
    const local = (ev) => { const box = canvas.getBoundingClientRect(); return [ev.clientX - box.left, ev.clientY - box.top, box]; };
    canvas.addEventListener("mousedown", (ev) => { const [x] = local(ev); drag = { x0: x, x1: x }; });
    window.addEventListener("mouseup", () => {
      if (!drag) return;
      const a = Math.max(left, Math.min(drag.x0, drag.x1)), b = Math.min(width() - right, Math.max(drag.x0, drag.x1));
      if (b - a > 4) { const ta = timeAt(a), tb = timeAt(b); view.t0 = ta; view.t1 = tb; }
      drag = null;
      draw();
    });
    canvas.addEventListener("dblclick", () => { view.t0 = 0; view.t1 = makespan; draw(); });
    canvas.addEventListener("mousemove", (ev) => {
      const [x, y, box] = local(ev);
      if (drag) { drag.x1 = x; draw(); return; }
      const r = Math.floor((y - top) / rowH), time = timeAt(x);
      const evs = events[r];
      let hit = null;
      if (evs && x >= left) {
        let lo = 0, hi = evs.length - 1;
        while (lo <= hi) {
          const mid = (lo + hi) >> 1;
          if (evs[mid].end < time) lo = mid + 1; else if (evs[mid].start > time) hi = mid - 1; else { hit = evs[mid]; break; }
        }
      }
      if (!hit) { tip.hidden = true; return; }
      tip.hidden = false;
      tip.textContent = `rank ${r}: ${t.labels[hit.kind]} of micro-batch ${hit.mb}` + (t.vpp > 1 ? `, chunk ${hit.chunk}` : "") +
        `, ${num(hit.start, 4)}–${num(hit.end, 4)} s`;
      tip.style.left = Math.min(x + 12, box.width - 280) + "px"; tip.style.top = y + 12 + "px";
    });
    canvas.addEventListener("mouseleave", () => { tip.hidden = true; });
  }

  // ------------------------------------------------------------------ validate: predicted vs measured

  function initValidate(v) {
    const s = v.summary;
    const pct = (x) => (x == null ? "-" : `${num(100 * x, 1)} %`);
    $("validate-summary").textContent = `${v.model} on ${v.world} ranks (${v.backend}, ${v.cluster}), ${v.layouts.length} layouts, ` +
      `global batch ${v.global_batch} × ${v.seq_len} tokens. Step time: median error ${pct(s.median_abs_error)}, p90 ${pct(s.p90_abs_error)}; ` +
      `Spearman ${num(s.spearman, 2)}, Kendall τ ${num(s.kendall_tau, 2)}; planner's pick ${pct(s.top1_regret)} slower than the measured best. ` +
      `Memory: median error ${pct(s.memory_median_abs_error)}, p90 ${pct(s.memory_p90_abs_error)}.` +
      (v.drift_corrected ? ` At the machine's speed during the sweep: median error ${pct(v.drift_corrected.median_abs_error)}, ` +
        `p90 ${pct(v.drift_corrected.p90_abs_error)}, Kendall τ ${num(v.drift_corrected.kendall_tau, 2)}.` : "") +
      (v.warnings || []).map((w) => ` Warning: ${w}.`).join("");
    const rows = v.layouts.slice().sort((a, b) => a.measured_s - b.measured_s);
    const err = (p, m) => {  // to the tenth of a point, a rounded-away difference as 0.0 (not -0.0)
      const d = Math.round((1000 * (p - m)) / m) / 10;
      return `${d > 0 ? "+" : ""}${num(d === 0 ? 0 : d, 1)} %`;
    };
    document.querySelector("#validate-table tbody").innerHTML = rows.map((x) => `<tr><td class="text">${esc(x.name)}${x.noisy ? " (noisy)" : ""}</td>` +
      `<td>${num(1e3 * x.predicted_s, 2)}</td><td>${num(1e3 * x.measured_s, 2)}</td><td>${err(x.predicted_s, x.measured_s)}</td>` +
      `<td>${num(x.predicted_mib, 2)}</td><td>${num(x.measured_mib, 2)}</td><td>${err(x.predicted_mib, x.measured_mib)}</td></tr>`).join("");
    const family = (x) => (x.tp > 1 ? 1 : x.pp > 1 ? 2 : 0);
    const names = ["data parallel", "tensor parallel", "pipeline"];
    const ms = rows.flatMap((x) => [1e3 * x.predicted_s, 1e3 * x.measured_s]);
    // the axes' ends on 1-2-5 steps, where Chart.js draws a tick anyway: an end at the data (31.9, 434.5) drew its
    // own label over the neighbouring tick's ("434.5" over "400")
    const nice = (x, up) => {
      const p = 10 ** Math.floor(Math.log10(x));
      const steps = up ? [1, 2, 5, 10].map((k) => k * p).filter((v) => v >= x) : [10, 5, 2, 1].map((k) => k * p).filter((v) => v <= x);
      return steps[0];
    };
    const lo = nice(Math.min(...ms) / 1.3, false), hi = nice(Math.max(...ms) * 1.3, true);
    api.charts.validate = new Chart($("validate-chart"), {
      type: "scatter",
      data: {
        datasets: names.map((name, f) => ({
          label: name, backgroundColor: PALETTE[f], pointRadius: 5,
          data: rows.filter((x) => family(x) === f).map((x) => ({ x: 1e3 * x.measured_s, y: 1e3 * x.predicted_s, name: x.name })),
        })).concat([{ type: "line", label: "predicted = measured", data: [{ x: lo, y: lo }, { x: hi, y: hi }], borderColor: "#999", borderDash: [5, 4], pointRadius: 0, borderWidth: 1 }]),
      },
      options: {
        aspectRatio: 1,
        scales: { x: { type: "logarithmic", min: lo, max: hi, title: { display: true, text: "measured step time (ms)" } },
                  y: { type: "logarithmic", min: lo, max: hi, title: { display: true, text: "predicted step time (ms)" } } },
        plugins: { tooltip: { callbacks: { label: (it) => `${it.raw.name || ""}: measured ${num(it.raw.x, 2)} ms, predicted ${num(it.raw.y, 2)} ms` } } },
      },
    });
  }

  if (DATA.plan) {
    initWinner(DATA.plan);
    initTable(DATA.plan);
    initTimeline(DATA.plan);
  }
  if (DATA.validate) initValidate(DATA.validate);
  api.readyMs = performance.now();  // since navigation start: the render time benchmarks/report_render.py reports
  api.ready = true;
})();
