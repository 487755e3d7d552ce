// The live dashboard (DESIGN §9). Plain JS, no build step: it renders the snapshot embedded in
// the page, opens /ws/dashboard and applies its events (snapshot, call.started, call.progress, call.ended,
// hold.started, hold.ended, alert.raised). Countdowns tick every 250 ms against the server's
// clock (the browser's clock corrected by each snapshot's now_ms).
"use strict";

(function () {
  const TICK_MS = 250;
  const REFRESH_MS = 10000; // a fresh snapshot: breaker changes have no event of their own
  const GONE_MS = 8000; // how long an ended call or hold stays on screen, greyed
  const MAX_ALERTS = 60;

  const state = {
    offset: 0, // server clock minus browser clock
    calls: new Map(), // id -> call
    holds: new Map(), // agent \0 model -> hold
    waiting: [], // turns whose next call waits for their pacing (the snapshot's)
    gone: new Map(), // key -> {kind: "call"|"hold", row, at}
    breakers: [],
    spendToday: null, // {cost, calls, unpriced_calls, day, zone, currency}
    providersDown: [],
    alerts: [], // newest first
    seenAlerts: new Set(),
    journalReadable: true,
    loaded: false,
  };

  const now = () => Date.now() + state.offset;
  const $ = (id) => document.getElementById(id);

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") node.className = v;
      else if (k.startsWith("data-")) node.setAttribute(k, v);
      else node[k] = v;
    }
    for (const child of children) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  // --- formatting ------------------------------------------------------------------------

  function duration(ms) {
    ms = Math.max(0, ms);
    if (ms < 10000) return (ms / 1000).toFixed(1) + " s";
    const s = Math.floor(ms / 1000);
    if (s < 60) return s + " s";
    const m = Math.floor(s / 60);
    if (m < 60) return m + " min " + String(s % 60).padStart(2, "0") + " s";
    const h = Math.floor(m / 60);
    if (h < 48) return h + " h " + String(m % 60).padStart(2, "0") + " min";
    return Math.floor(h / 24) + " days " + (h % 24) + " h";
  }

  // Every instant on the page in UTC, as the admin and the API write them (not the browser's zone).
  function clock(ms) {
    return new Date(ms).toISOString().slice(11, 19) + " UTC";
  }

  // At most `limit` characters, cut at a word boundary (as agentops.wording.excerpt).
  function excerpt(text, limit) {
    text = text.split(/\s+/).join(" ").trim();
    if (text.length <= limit) return text;
    let cut = text.slice(0, limit - 1);
    const space = cut.lastIndexOf(" ");
    if (space >= (limit - 1) / 2) cut = cut.slice(0, space);
    return cut.replace(/[ ,;:.(-]+$/, "") + "…";
  }

  function ago(ms) {
    const d = now() - ms;
    return d < 5000 ? "just now" : duration(d) + " ago";
  }

  const words = (s) => String(s || "").replace(/_/g, " ");
  const holdKey = (h) => h.agent + "\u0000" + h.model;

  // --- events -----------------------------------------------------------------------------

  function applySnapshot(snap) {
    state.offset = snap.now_ms - Date.now();
    state.calls = new Map(snap.calls.map((c) => [c.id, c]));
    state.holds = new Map(snap.holds.map((h) => [holdKey(h), h]));
    state.waiting = snap.waiting || [];
    for (const [key, g] of state.gone) {
      if ((g.kind === "call" && state.calls.has(g.row.id)) || (g.kind === "hold" && state.holds.has(key))) state.gone.delete(key);
    }
    state.breakers = snap.breakers;
    state.spendToday = snap.spend_today || null;
    state.providersDown = snap.providers_down || [];
    state.journalReadable = snap.journal_readable;
    for (const a of snap.alerts.slice().reverse()) addAlert(a, state.loaded);
    state.loaded = true;
    renderAll();
  }

  function addAlert(alert, fresh) {
    if (state.seenAlerts.has(alert.id)) {
      const known = state.alerts.find((a) => a.id === alert.id);
      if (known) Object.assign(known, alert); // e.g. acknowledged since
      return;
    }
    state.seenAlerts.add(alert.id);
    alert._fresh = fresh;
    state.alerts.push(alert);
    state.alerts.sort((a, b) => b.id - a.id);
    state.alerts.length = Math.min(state.alerts.length, MAX_ALERTS);
  }

  const handlers = {
    snapshot: applySnapshot,
    "call.started": (e) => {
      e.call._fresh = true;
      state.calls.set(e.call.id, e.call);
      state.gone.delete("call-" + e.call.id);
      renderCalls();
    },
    // Throttled progress of in-flight calls (a few a second at most): counts so far, and the
    // nearest deadline now, which moves as model events arrive.
    "call.progress": (e) => {
      let changed = false;
      for (const p of e.calls) {
        const c = state.calls.get(p.id);
        if (!c) continue; // already ended, or not shown
        const moved = c.deadline_ms !== p.deadline_ms;
        Object.assign(c, {
          deadline_ms: p.deadline_ms, bound: p.bound, model_events: p.model_events, keepalives: p.keepalives,
          first_event_ms: p.first_event_ms, first_content_ms: p.first_content_ms, last_event_ms: p.last_event_ms,
        });
        changed = changed || moved;
      }
      if (changed) renderCalls(); else tick();
    },
    "call.ended": (e) => {
      const row = Object.assign({}, state.calls.get(e.call.id) || {}, e.call);
      state.calls.delete(e.call.id);
      state.gone.set("call-" + e.call.id, { kind: "call", row, at: now() });
      renderCalls();
    },
    "hold.started": (e) => {
      e.hold._fresh = true;
      state.holds.set(holdKey(e.hold), e.hold);
      state.gone.delete(holdKey(e.hold));
      renderHolds();
    },
    "hold.ended": (e) => {
      const key = holdKey(e.hold);
      const row = Object.assign({}, state.holds.get(key) || {}, e.hold);
      state.holds.delete(key);
      state.gone.set(key, { kind: "hold", row, at: now(), why: e.hold.why || "released" });
      renderHolds();
    },
    "alert.raised": (e) => {
      addAlert(e.alert, true);
      renderAlerts();
      renderSummary();
    },
  };

  // --- rendering --------------------------------------------------------------------------

  function countdownCell(target, start, label, cls) {
    const cell = el("td", { "data-until": target, "data-start": start, "data-label": label, class: cls || "" });
    cell.append(el("div", { class: "countdown" }), el("div", { class: "bar" }, el("span")));
    return cell;
  }

  // A call's reported tokens; a count the provider did not report is not shown as 0.
  function tokens(usage) {
    if (!usage) return null;
    const shown = (n) => (n === null || n === undefined ? "–" : String(n));
    if (usage.input_tokens == null && usage.output_tokens == null) return el("div", { class: "sub tokens" }, "tokens not reported");
    let text = shown(usage.input_tokens) + " in / " + shown(usage.output_tokens) + " out tokens";
    if (usage.reasoning_tokens != null) text += " (" + usage.reasoning_tokens + " reasoning)";
    if (usage.cached_input_tokens) text += ", " + usage.cached_input_tokens + " cached";
    return el("div", { class: "sub tokens" }, text);
  }

  function renderCalls() {
    const body = $("calls");
    body.replaceChildren();
    const rows = [...state.calls.values()].sort((a, b) => nearest(a) - nearest(b));
    for (const c of rows) {
      const tr = el("tr", { class: c._fresh ? "fresh" : "" });
      c._fresh = false;
      tr.append(
        el("td", {}, el("span", { class: "agent" }, c.agent), c.turn ? el("div", { class: "sub" }, "turn " + c.turn) : null),
        el("td", { class: "mono" }, c.model),
        el("td", {}, el("span", { class: "tag " + c.kind }, c.kind), c.streamed ? null : el("div", { class: "sub" }, "not streamed")),
        el("td", { class: "num", "data-since": c.since_ms }),
        callDeadlineCell(c),
      );
      body.append(tr);
    }
    for (const [key, g] of state.gone) {
      if (g.kind !== "call") continue;
      const c = g.row;
      let what = words(c.outcome);
      if (c.outcome === "cut") what += " by the " + words(c.bound) + " bound" + (c.cut_lateness_ms != null ? ", " + c.cut_lateness_ms.toFixed(0) + " ms after its deadline" : "");
      body.append(el("tr", { class: "gone", "data-gone": key },
        el("td", {}, el("span", { class: "agent" }, c.agent)),
        el("td", { class: "mono" }, c.model),
        el("td", {}, el("span", { class: "tag " + c.kind }, c.kind)),
        el("td", { class: "num" }, c.since_ms ? duration((c.ended_ms || now()) - c.since_ms) : ""),
        el("td", {}, "ended: ", el("span", { class: "outcome outcome-" + c.outcome }, what), tokens(c.usage)),
      ));
    }
    $("calls-count").textContent = state.calls.size;
    $("calls-empty").hidden = body.children.length > 0;
    tick();
    renderSummary();
  }

  function nearest(c) {
    if (c.deadline_ms == null) return Infinity;
    return c.deadline_ms > now() ? c.deadline_ms : c.final_ms;
  }

  function callDeadlineCell(c) {
    if (c.deadline_ms == null) return el("td", { class: "sub" }, "bounds are off");
    const cell = el("td", { "data-call": c.id, "data-bound": c.bound || "", "data-deadline": c.deadline_ms });
    cell.append(el("div", { class: "countdown" }), el("div", { class: "bar" }, el("span")), el("div", { class: "sub" }));
    return cell;
  }

  function progressNote(c) {
    if (c.model_events == null) return "";
    const parts = [c.model_events + " model event" + (c.model_events === 1 ? "" : "s"), c.keepalives + " keepalive" + (c.keepalives === 1 ? "" : "s")];
    if (c.first_content_ms != null) parts.push("content since " + duration(now() - c.first_content_ms));
    return parts.join(", ");
  }

  function tickCall(cell, c, t) {
    let text, cls, left, span, note = progressNote(c);
    cell.dataset.bound = c.bound || "";
    cell.dataset.deadline = c.deadline_ms;
    if (t < c.deadline_ms) {
      left = c.deadline_ms - t; span = Math.max(1, c.deadline_ms - (c.last_event_ms || c.since_ms));
      text = words(c.bound) + " in " + duration(left);
      if (c.bound === "before_content") note = (note ? note + "; " : "") + "cut then unless content arrives first";
      else if (c.bound === "between_events") note = (note ? note + "; " : "") + "moves with each model event";
    } else if (c.final_ms != null && c.final_ms > c.deadline_ms && t < c.final_ms) {
      // Past its first deadline and not cut: it is receiving model events.
      left = c.final_ms - t; span = c.final_ms - c.since_ms;
      text = "receiving; " + words(c.final_bound) + " in " + duration(left);
      cls = "calm";
    } else {
      left = 0; span = 1;
      const over = t - (c.final_ms || c.deadline_ms);
      text = over < 3000 ? "deadline reached: being cut" : "past its deadline by " + duration(over) + " (no end recorded: its worker may have stopped)";
      cls = "late";
    }
    if (!cls) cls = left < Math.min(5000, span * 0.25) ? "soon" : "";
    cell.className = cls;
    cell.children[0].textContent = text;
    cell.children[1].firstChild.style.width = (100 * Math.max(0, Math.min(1, left / span))).toFixed(1) + "%";
    cell.children[2].textContent = note;
  }

  function renderHolds() {
    const body = $("holds");
    body.replaceChildren();
    const rows = [...state.holds.values()].sort((a, b) => (a.until_ms ?? Infinity) - (b.until_ms ?? Infinity));
    for (const h of rows) {
      const tr = el("tr", { class: h._fresh ? "fresh" : "" });
      h._fresh = false;
      const ends = h.until_ms == null
        ? el("td", {}, el("div", { class: "countdown" }, h.source === "unreadable" ? "until the journal reads again" : "until released"), h.set_at_ms ? el("div", { class: "sub" }, "since " + clock(h.set_at_ms)) : null)
        : countdownCell(h.until_ms, h.set_at_ms || h.until_ms, "ends in");
      tr.append(
        el("td", {}, el("span", { class: "agent" }, h.agent)),
        el("td", { class: "mono" }, h.model === "*" ? "* (every model)" : h.model),
        ends,
        el("td", {}, h.reason, h.source === "pending" ? el("div", { class: "sub" }, "pending: binds in one process, not yet recorded") : null),
      );
      body.append(tr);
    }
    for (const [key, g] of state.gone) {
      if (g.kind !== "hold") continue;
      body.append(el("tr", { class: "gone", "data-gone": key },
        el("td", {}, el("span", { class: "agent" }, g.row.agent)),
        el("td", { class: "mono" }, g.row.model),
        el("td", {}, el("span", { class: "outcome outcome-completed" }, "ended")),
        el("td", {}, g.why),
      ));
    }
    const waiting = $("waiting");
    waiting.replaceChildren();
    for (const w of state.waiting) {
      if (w.waiting_until_ms <= now()) continue;
      waiting.append(el("tr", {},
        el("td", {}, el("span", { class: "agent" }, w.agent)),
        el("td", { class: "mono" }, "#" + w.turn),
        countdownCell(w.waiting_until_ms, state.offset + Date.now(), "in"),
        el("td", {}, w.waiting_reason),
      ));
    }
    $("waiting-count").textContent = waiting.children.length;
    $("waiting-empty").hidden = waiting.children.length > 0;
    $("holds-count").textContent = state.holds.size;
    $("holds-empty").hidden = body.children.length > 0;
    $("journal-unreadable").hidden = state.journalReadable;
    tick();
    renderSummary();
  }

  // The last call's input against the model's known window (architecture.md §5.9).
  function contextBar(c) {
    if (!c || !c.window) return el("span", { class: "sub" }, c && c.last_input_tokens ? c.last_input_tokens + " tokens, no window known" : "—");
    const used = c.used_fraction || 0;
    const fill = el("span");
    fill.style.width = Math.min(used * 100, 100).toFixed(1) + "%";
    return el("div", { class: "context" + (used >= 0.8 ? " near" : "") },
      Math.round(used * 100) + "% of " + c.window,
      el("div", { class: "bar" }, fill));
  }

  // The model serving the agent: its own, or an alternate with why and the primary's wait
  // (architecture.md §6.11); the countdown is as of this render.
  function servingCell(b) {
    if (!b.serving) return el("td", { class: "mono" }, b.model);
    const s = b.serving;
    const back = s.primary_until_ms ? "primary back in " + duration(s.primary_until_ms - Date.now()) : null;
    return el("td", { class: "mono" },
      el("span", { class: "tag fallback" }, "alternate"), " " + s.model,
      el("div", { class: "sub" }, s.reason + (back ? "; " + back : "")),
      el("div", { class: "sub" }, "own model: " + b.model));
  }

  // An amount of spend as the API writes it; unknown (unpriced) is said so, never shown as 0.
  function spendText(s) {
    if (!s || !s.calls) return "nothing";
    if (s.cost === null || s.cost === undefined) return "unpriced";
    return s.cost;
  }

  // Today's spend of an agent (the local day of the budgets' zone) and each budget it counts
  // against: spent / amount this period, and whether the budget holds the agent.
  function spendCell(b) {
    const s = b.spend_today;
    const cell = el("td", { class: "spend" + (s && s.calls && s.cost == null ? " unpriced" : "") },
      el("span", { class: "amount" }, spendText(s)),
      s && s.cost != null && s.unpriced_calls ? el("span", { class: "sub" }, " +" + s.unpriced_calls + " unpriced") : null);
    for (const budget of b.budgets || []) {
      cell.append(el("div", { class: "sub budget" + (budget.held ? " held" : "") },
        (budget.scope === "project" ? "project " : "") + budget.spent + " / " + budget.amount + " per " + budget.period,
        budget.held ? el("span", { class: "tag held" }, "held") : null));
    }
    return cell;
  }

  function renderBreakers() {
    const body = $("breakers");
    body.replaceChildren();
    for (const b of state.breakers) {
      const quiet = b.streak === 0 && !b.probe && b.sheds_this_run === 0 && b.set_aside === 0;
      const boxes = el("div", { class: "streak" + (b.streak >= b.threshold ? " down" : "") });
      for (let i = 0; i < Math.max(b.threshold, Math.min(b.streak, 12)); i++) boxes.append(el("i", { class: i < b.streak ? "on" : "" }));
      boxes.append(el("span", { class: "label" }, b.streak + " / " + b.threshold + (b.streak >= b.threshold ? " hard down" : "")));
      let probe = el("span", { class: "sub" }, "none");
      if (b.probe) {
        probe = el("div", {},
          el("span", { class: "tag probe" }, b.probe.status === "out" ? "out" : words(b.probe.status)),
          b.probe.sent_ms ? el("span", { class: "sub", "data-ago": b.probe.sent_ms }, " sent " + ago(b.probe.sent_ms)) : null,
          b.probe.verdict ? el("div", { class: "sub" }, b.probe.verdict) : null);
      }
      body.append(el("tr", { class: quiet ? "quiet" : "" },
        el("td", {}, el("span", { class: "agent" }, b.agent), el("div", { class: "sub" }, b.kind)),
        servingCell(b),
        el("td", {}, boxes),
        el("td", {}, probe),
        el("td", { class: "num" }, b.sheds_this_run + " / " + b.shed_cap),
        el("td", { class: "num" }, b.set_aside ? b.set_aside + " rows" : "—"),
        spendCell(b),
        el("td", {}, contextBar(b.context)),
      ));
    }
    $("breakers-empty").hidden = state.breakers.length > 0;
    renderSummary();
  }

  function renderProviders() {
    const body = $("providers");
    body.replaceChildren();
    for (const p of state.providersDown) {
      body.append(el("tr", {},
        el("td", {}, el("span", { class: "agent" }, p.provider)),
        el("td", { class: "when", "data-ago": p.since_ms }, ago(p.since_ms)),
        el("td", { class: "sub" }, excerpt(p.error, 300)),
      ));
    }
    $("providers-count").textContent = state.providersDown.length;
    $("providers-panel").hidden = state.providersDown.length === 0;
  }

  function renderAlerts() {
    const list = $("alerts");
    list.replaceChildren();
    for (const a of state.alerts) {
      const at = Date.parse(a.created_at);
      const li = el("li", { class: "kind-" + a.kind + (a.acknowledged_at ? " acked" : "") + (a._fresh ? " fresh" : "") },
        el("div", { class: "head" },
          el("span", { class: "kind" }, a.kind),
          el("span", { class: "agent" }, a.agent),
          a.model ? el("span", { class: "mono sub" }, a.model) : null,
          a.verdict ? el("span", { class: "tag" }, a.verdict) : null,
          el("span", { class: "when", "data-ago": at, title: a.created_at }, ago(at))),
        el("div", { class: "msg", title: a.message }, excerpt(a.message, 400)),
        a.acknowledged_at ? el("div", { class: "sub" }, "acknowledged by " + (a.acknowledged_by || "someone")) : null,
      );
      a._fresh = false;
      list.append(li);
    }
    $("alerts-count").textContent = state.alerts.filter((a) => !a.acknowledged_at).length;
    $("alerts-empty").hidden = state.alerts.length > 0;
  }

  function renderSummary() {
    const down = state.breakers.filter((b) => b.streak >= b.threshold).length;
    const failing = state.breakers.filter((b) => b.streak > 0).length;
    const probes = state.breakers.filter((b) => b.probe && b.probe.status === "out").length;
    const open = state.alerts.filter((a) => !a.acknowledged_at).length;
    const parts = [
      [state.calls.size, state.calls.size === 1 ? "call in flight" : "calls in flight"],
      [state.holds.size, state.holds.size === 1 ? "hold" : "holds"],
      [failing, (failing === 1 ? "failing agent" : "failing agents") + (down ? " (" + down + " hard down)" : "")],
      [probes, probes === 1 ? "probe out" : "probes out"],
      [state.providersDown.length, state.providersDown.length === 1 ? "provider down" : "providers down"],
      [open, "alerts not acknowledged"],
    ];
    const summary = $("summary");
    summary.replaceChildren();
    parts.forEach(([n, label], i) => summary.append(i ? " · " : "", el("b", {}, n), " " + label));
    const s = state.spendToday;
    if (s) {
      const spent = el("span", { id: "spend-today", title: "the calls ended on " + s.day + " (" + s.zone + ")" }, " · ");
      if (s.cost != null) spent.append(el("b", {}, s.cost), " " + s.currency + " spent today");
      else spent.append(el("b", {}, s.calls ? "unpriced" : "nothing"), " spent today");
      const calls = (n) => n + " unpriced call" + (n === 1 ? "" : "s");
      if (s.cost != null && s.unpriced_calls) spent.append(" (+" + calls(s.unpriced_calls) + ")");
      else if (s.cost == null && s.calls) spent.append(" (" + calls(s.calls) + ")");
      summary.append(spent);
    }
  }

  function renderAll() {
    renderCalls();
    renderHolds();
    renderBreakers();
    renderProviders();
    renderAlerts();
  }

  // --- the clock --------------------------------------------------------------------------

  function tick() {
    const t = now();
    let changed = false;
    for (const [key, g] of state.gone) {
      if (t - g.at > GONE_MS) { state.gone.delete(key); changed = true; }
    }
    for (const [key, h] of state.holds) {
      if (h.until_ms != null && h.until_ms <= t) {
        state.holds.delete(key);
        state.gone.set(key, { kind: "hold", row: h, at: t, why: "the wait is over" });
        changed = true;
      }
    }
    if (state.waiting.some((w) => w.waiting_until_ms <= t)) {
      state.waiting = state.waiting.filter((w) => w.waiting_until_ms > t);
      changed = true;
    }
    if (changed) { renderCalls(); renderHolds(); return; }
    for (const cell of document.querySelectorAll("[data-since]")) cell.textContent = duration(t - Number(cell.dataset.since));
    for (const cell of document.querySelectorAll("[data-call]")) {
      const c = state.calls.get(Number(cell.dataset.call));
      if (c) tickCall(cell, c, t);
    }
    for (const cell of document.querySelectorAll("[data-until]")) {
      const until = Number(cell.dataset.until), start = Number(cell.dataset.start);
      const left = until - t, span = Math.max(1, until - start);
      cell.className = left < Math.min(10000, span * 0.25) ? "soon" : "";
      cell.firstChild.textContent = cell.dataset.label + " " + duration(left) + " (" + clock(until) + ")";
      cell.lastChild.firstChild.style.width = (100 * Math.max(0, Math.min(1, left / span))).toFixed(1) + "%";
    }
    for (const node of document.querySelectorAll("[data-ago]")) node.textContent = (node.classList.contains("when") ? "" : " sent ") + ago(Number(node.dataset.ago));
  }

  // --- the socket -------------------------------------------------------------------------

  let backoff = 1000;

  function setConn(cls, text) {
    const c = $("conn");
    c.className = "conn " + cls;
    c.textContent = text;
  }

  function connect() {
    const scheme = location.protocol === "https:" ? "wss://" : "ws://";
    const socket = new WebSocket(scheme + location.host + "/ws/dashboard");
    let refresher = null;
    socket.onopen = () => {
      backoff = 1000;
      setConn("conn-live", "live");
      refresher = setInterval(() => socket.send(JSON.stringify({ type: "snapshot" })), REFRESH_MS);
    };
    socket.onmessage = (msg) => {
      const event = JSON.parse(msg.data);
      const handle = handlers[event.type];
      if (handle) handle(event);
    };
    socket.onclose = (e) => {
      clearInterval(refresher);
      if (e.code === 4401 || e.code === 4403) {
        setConn("conn-down", e.code === 4401 ? "signed out: reload to sign in" : "not staff");
        return;
      }
      const why = e.code === 4429 ? "too many dashboards open on this server" : "disconnected";
      setConn("conn-down", why + "; retrying in " + Math.round(backoff / 1000) + " s");
      setTimeout(connect, backoff);
      backoff = Math.min(backoff * 2, 15000);
    };
  }

  applySnapshot(JSON.parse($("dashboard-snapshot").textContent));
  setInterval(tick, TICK_MS);
  connect();
})();
