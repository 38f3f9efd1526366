// Shared by the pages: the view in the URL, fetching with readable errors,
// panels that fail on their own, state colours and bars.
"use strict";

const WS = (() => {
  // The daemon's names, from /ui/meta.json (filled before the pages start:
  // see `ready` below), so that no list here can drift from the API's.
  /** Thread states in the order bars and timelines draw them. */
  const STATES = [];
  /** Profile kinds (`kind=`), flame graph groupings (`group=`) and
   * `/processes` orders (`sort=`), as the API names them. */
  const KINDS = [];
  const GROUPS = [];
  const SORTS = [];
  /** `/processes?strip=1` letters, by the state each stands for. */
  const STRIP_LETTERS = {};
  const WINDOWS = [["30", "30 s"], ["60", "1 min"], ["300", "5 min"], ["600", "10 min"]];

  /** The page's view: its query string, which is what a pasted link keeps. */
  function view() {
    return new URLSearchParams(location.search);
  }

  /** Changes the view (null deletes a key) and keeps the URL pasteable. */
  function setView(changes) {
    const v = view();
    for (const [k, val] of Object.entries(changes)) {
      if (val === null || val === undefined || val === "") v.delete(k);
      else v.set(k, val);
    }
    history.replaceState(null, "", `${location.pathname}?${v}`);
  }

  /** The window parameters of the view: from/until when set, else seconds. */
  function windowQuery(v = view()) {
    if (v.get("from") && v.get("until")) return { from: v.get("from"), until: v.get("until") };
    return { seconds: v.get("seconds") || "30" };
  }

  function describeWindow(v = view()) {
    const w = windowQuery(v);
    if (w.seconds) return `last ${w.seconds} s`;
    const t = (s) => new Date(Number(s) * 1000).toLocaleTimeString();
    return `${t(w.from)} – ${t(w.until)}`;
  }

  // One line on the resolution of a window's older parts (the store merges
  // old seconds into 10 s and 60 s slices and, under memory pressure, folds
  // threads' stacks into their pools); "" when all of it is per second.
  function resolutionNote(parts) {
    const coarse = (parts || []).filter((p) => p.step_s > 1 || p.rows === "pool");
    if (!coarse.length) return "";
    const words = coarse.reverse().map((p) =>
      `${p.step_s} s steps ${p.to_s_ago}–${p.from_s_ago} s ago${p.rows === "pool" ? " (threads folded into pools)" : ""}`);
    return `older history merged: ${words.join(", ")}`;
  }

  function query(params) {
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== null && v !== "") q.set(k, v);
    return q.toString();
  }

  /** Tries of a query the daemon refused as busy (503 with Retry-After). */
  const BUSY_TRIES = 4;

  async function fetchOk(url) {
    let res = await fetch(url);
    // The daemon computes two queries at a time and refuses what would wait
    // too long: wait as it asks (at most 5 s) and try again.
    for (let tries = 1; res.status === 503 && tries < BUSY_TRIES; tries++) {
      const after = Math.min(Number(res.headers.get("retry-after")) || 1, 5);
      await new Promise((done) => setTimeout(done, after * 1000));
      res = await fetch(url);
    }
    if (!res.ok) {
      let message = res.statusText;
      try {
        const body = await res.text();
        try { message = JSON.parse(body).error || body; } catch (_) { message = body || message; }
      } catch (_) { /* keep the status text */ }
      const err = new Error(`${url}: HTTP ${res.status}: ${String(message).trim()}`);
      err.status = res.status;
      throw err;
    }
    return res;
  }

  const getJSON = async (url) => (await fetchOk(url)).json();
  const getText = async (url) => (await fetchOk(url)).text();

  /**
   * Runs `fill` for the panel `id`: its failure is shown in that panel and
   * marked on it (data-state="error"), and no other panel is affected.
   */
  async function panel(id, fill) {
    const el = document.getElementById(id);
    if (!el) return;
    const msg = el.querySelector(".panel-error");
    el.dataset.state = "loading";
    try {
      await fill(el);
      if (msg) msg.textContent = "";
      el.dataset.state = "ready";
    } catch (e) {
      el.dataset.state = "error";
      if (msg) msg.textContent = e.message || String(e);
    }
  }

  // One formatter: toLocaleString with options builds one per call, which
  // took half a second over a 10,000-thread table.
  const msFormat = new Intl.NumberFormat(undefined, { maximumFractionDigits: 1 });
  const ms = (us) => msFormat.format(us / 1000);
  const pct = (part, whole) => (whole ? (100 * part / whole).toFixed(1) : "0.0");

  /** The state that took most of `t` (an object with `<state>_us`). */
  function dominant(t) {
    let best = STATES[0];
    for (const s of STATES) if ((t[`${s}_us`] || 0) > (t[`${best}_us`] || 0)) best = s;
    return best;
  }

  /** A bar of `t`'s wall time split by state, with a tooltip. */
  function stateBar(t) {
    const bar = document.createElement("span");
    bar.className = "bar";
    const wall = STATES.reduce((a, s) => a + (t[`${s}_us`] || 0), 0);
    const tip = [];
    for (const s of STATES) {
      const v = t[`${s}_us`] || 0;
      if (!v || !wall) continue;
      const seg = document.createElement("span");
      seg.className = `state-${s}`;
      seg.style.width = `${(100 * v) / wall}%`;
      bar.append(seg);
      tip.push(`${s} ${pct(v, wall)}% (${ms(v)} ms)`);
    }
    bar.title = tip.join("\n") || "nothing recorded";
    return bar;
  }

  /** Sizes `canvas` to `width` × `height` CSS pixels, sharp on HiDPI
   * screens, and returns its cleared 2D context in CSS pixels. */
  function sizeCanvas(canvas, width, height) {
    const ratio = window.devicePixelRatio || 1;
    canvas.width = width * ratio;
    canvas.height = height * ratio;
    canvas.style.width = `${width}px`;
    canvas.style.height = `${height}px`;
    const g = canvas.getContext("2d");
    g.setTransform(ratio, 0, 0, ratio, 0, 0);
    g.clearRect(0, 0, width, height);
    return g;
  }

  function legend() {
    const div = document.createElement("div");
    div.className = "legend";
    for (const s of STATES) {
      const item = document.createElement("span");
      const sw = document.createElement("span");
      sw.className = `swatch state-${s}`;
      item.append(sw, s);
      div.append(item);
    }
    return div;
  }

  function el(tag, attrs = {}, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs)) {
      if (k === "class") e.className = v;
      else if (k.startsWith("data-")) e.setAttribute(k, v);
      else e[k] = v;
    }
    e.append(...children.filter((c) => c !== null && c !== undefined));
    return e;
  }

  /**
   * The window picker: presets, or an absolute range from two local
   * date-times. Calls `changed` after the view is updated.
   */
  function windowPicker(changed) {
    const v = view();
    const sel = el("select", { id: "window" });
    for (const [val, text] of WINDOWS) sel.append(el("option", { value: val, textContent: text }));
    sel.append(el("option", { value: "range", textContent: "range…" }));
    const from = el("input", { type: "datetime-local", id: "window-from", step: 1 });
    const until = el("input", { type: "datetime-local", id: "window-until", step: 1 });
    const range = el("span", { id: "window-range" }, from, " – ", until);
    const local = (s) => {
      const d = new Date(Number(s) * 1000);
      return new Date(d.getTime() - d.getTimezoneOffset() * 60000).toISOString().slice(0, 19);
    };
    const w = windowQuery(v);
    if (w.seconds) {
      if (![...sel.options].some((o) => o.value === w.seconds)) {
        sel.insertBefore(el("option", { value: w.seconds, textContent: `${w.seconds} s` }), sel.lastChild);
      }
      sel.value = w.seconds;
      range.style.display = "none";
    } else {
      sel.value = "range";
      from.value = local(w.from);
      until.value = local(w.until);
    }
    const applyRange = () => {
      const f = Date.parse(from.value), u = Date.parse(until.value);
      if (Number.isFinite(f) && Number.isFinite(u) && u > f) {
        setView({ from: Math.floor(f / 1000), until: Math.ceil(u / 1000), seconds: null });
        changed();
      }
    };
    sel.addEventListener("change", () => {
      if (sel.value === "range") {
        range.style.display = "";
        const now = Date.now() / 1000;
        if (!from.value) from.value = local(now - 300);
        if (!until.value) until.value = local(now);
        applyRange();
        return;
      }
      range.style.display = "none";
      setView({ seconds: sel.value, from: null, until: null });
      changed();
    });
    from.addEventListener("change", applyRange);
    until.addEventListener("change", applyRange);
    return el("label", {}, "Window: ", sel, " ", range);
  }

  /** An auto-refresh toggle calling `tick` every `every` ms while on. */
  function autoRefresh(tick, every = 5000) {
    const box = el("input", { type: "checkbox", id: "auto-refresh" });
    box.checked = view().get("refresh") === "1";
    let timer = null;
    const arm = () => {
      clearInterval(timer);
      timer = box.checked ? setInterval(tick, every) : null;
    };
    box.addEventListener("change", () => {
      setView({ refresh: box.checked ? "1" : null });
      arm();
    });
    arm();
    return el("label", {}, box, " auto-refresh");
  }

  /** Makes `table`'s headers sort `rows` by their `key` and redraw. */
  function sortable(table, columns, state, redraw) {
    const tr = el("tr");
    for (const c of columns) {
      const th = el("th", { textContent: c.label, className: c.num ? "num" : "" });
      th.dataset.key = c.key;
      if (state.key === c.key) th.classList.add("sorted");
      th.addEventListener("click", () => {
        state.key = c.key;
        redraw();
      });
      tr.append(th);
    }
    table.append(el("thead", {}, tr));
  }

  /** Resolves once the names above are filled; a page starts after it. */
  const ready = getJSON("/ui/meta.json").then((meta) => {
    STATES.push(...meta.states);
    KINDS.push(...meta.kinds);
    GROUPS.push(...meta.groups);
    SORTS.push(...meta.sorts);
    Object.assign(STRIP_LETTERS, meta.strip_letters);
  });
  ready.catch((e) => document.body.prepend(el("p", { className: "panel-error", textContent: e.message })));

  return {
    STATES, KINDS, GROUPS, SORTS, STRIP_LETTERS, ready, view, setView, windowQuery, describeWindow, resolutionNote, query, getJSON, getText, panel,
    ms, pct, dominant, stateBar, legend, el, sizeCanvas, windowPicker, autoRefresh, sortable,
  };
})();
