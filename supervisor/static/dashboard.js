// corral's dashboard: fills the server-rendered pages from the control API.
//
// Rules this script keeps (the tests hold it to them):
// * Data is untrusted text: it reaches the page through textContent only, never innerHTML.
// * Nothing optimistic: the transcript shows what the SSE stream delivers (entries the store
//   saved), in seq order, each once; a stop's outcome is shown only once the API answered.
// * A second press of Stop while a stop is on its way sends nothing.
// * A stream that drops (a daemon restart) reconnects by itself from the last seq it saw,
//   saying "Reconnecting…" meanwhile.
"use strict";

(() => {
  const body = document.body;
  const connection = document.getElementById("connection");
  const CONNECTION_TEXT = {
    connecting: "Connecting…",
    live: "Live",
    reconnecting: "Reconnecting…",
    waiting: "No messages yet: send one to start the channel",
    "signed-out": "Signed out: run `corral dashboard` for a new login URL",
  };

  function setConnection(state) {
    connection.dataset.state = state;
    connection.textContent = CONNECTION_TEXT[state];
  }

  function plural(n, one, many) {
    return `${n} ${n === 1 ? one : many}`;
  }

  function clock(ts) {
    return new Date(ts * 1000).toLocaleTimeString([], { hour12: false });
  }

  function element(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined) node.textContent = text;
    return node;
  }

  // An EventSource that, when its stream ends, asks `probe` why (signed out? no such channel
  // yet?) and opens a new one from where it was (the URL carries the last seq seen).
  function follow(makeUrl, handlers, probe) {
    let delay = 250;
    let timer = null;
    function open() {
      timer = null;
      const source = new EventSource(makeUrl());
      source.addEventListener("open", () => {
        delay = 250;
        setConnection("live");
      });
      for (const [name, handler] of Object.entries(handlers)) source.addEventListener(name, handler);
      source.addEventListener("error", () => {
        source.close();
        setConnection("reconnecting");
        probe().then((state) => {
          if (state === "signed-out") {
            setConnection(state);
            return;
          }
          if (state === "waiting") setConnection(state);
          timer = setTimeout(open, delay);
          delay = Math.min(delay * 2, 4000);
        });
      });
    }
    open();
    return {
      // Reconnect at once if a reconnect is pending (a first message made the channel exist).
      now() {
        if (timer !== null) {
          clearTimeout(timer);
          open();
        }
      },
    };
  }

  async function probeUrl(url) {
    try {
      const response = await fetch(url, { cache: "no-store" });
      if (response.status === 401) return "signed-out";
      if (response.status === 404) return "waiting";
    } catch (err) {
      // The daemon is not answering: it is restarting, or gone.
    }
    return "reconnecting";
  }

  async function post(url, payload) {
    const response = await fetch(url, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(payload),
      cache: "no-store",
    });
    let result = null;
    try {
      result = await response.json();
    } catch (err) {
      result = null;
    }
    return { response, result };
  }

  function showAck(ack, state, text) {
    ack.dataset.state = state;
    ack.textContent = text;
  }

  function apiError(result, response) {
    const error = result && result.error;
    if (error && typeof error === "object") return `${error.message} (${response.status} ${error.code})`;
    return `${response.status} ${response.statusText}`;
  }

  function counts(result) {
    const killed = result.killed.length;
    const swept = result.swept.length;
    return (
      `${plural(killed, "process", "processes")} killed, ${swept} swept, ` +
      `${plural(result.dropped, "queued message", "queued messages")} dropped`
    );
  }

  // The acknowledged stop: "Stopping…" at once; the server's answer when it comes.
  function stopButton(button, ack, url, describe) {
    let stopping = false;
    button.addEventListener("click", async () => {
      if (stopping) return; // a second press during "Stopping…" sends nothing
      stopping = true;
      button.disabled = true;
      showAck(ack, "pending", "Stopping…");
      try {
        const { response, result } = await post(url, {});
        if (result === null || (!response.ok && !("ok" in result))) {
          showAck(ack, "failed", `Stop FAILED: ${result ? apiError(result, response) : response.status}. ` +
            "The agents may still be running.");
        } else if (!result.ok) {
          showAck(ack, "failed", `Stop FAILED, not confirmed: ${result.error}. The agents may still be running.`);
        } else {
          const [state, text] = describe(result);
          showAck(ack, state, text);
        }
      } catch (err) {
        showAck(ack, "failed", `Stop NOT confirmed: the daemon did not answer (${err.message}). ` +
          "The agents may still be running: press Stop again.");
      } finally {
        stopping = false;
        button.disabled = false;
      }
    });
  }

  // ------------------------------------------------------------------ the channel view

  const KINDS = new Set(["message", "status", "tool", "todos", "notice", "error"]);

  function renderEntry(entry) {
    const kind = KINDS.has(entry.kind) ? entry.kind : "other";
    const who = String(entry.author).split(":")[0];
    const item = element("li", `entry kind-${kind} author-${["human", "agent", "system"].includes(who) ? who : "other"}`);
    // What the turn spent (the line corral made of it, text like any other): under its answer.
    if (kind === "status" && entry.meta && entry.meta.usage) item.classList.add("usage");
    item.dataset.seq = String(entry.seq);
    item.dataset.kind = kind;
    item.__entry = entry; // (re-rendered when a later stop's notice says it was dropped)
    if (entry.turn) item.dataset.turn = String(entry.turn);
    const head = element("div", "head");
    head.append(element("span", "author", entry.author), element("span", "kind", entry.kind),
      element("time", "time", clock(entry.ts)));
    item.append(head);
    const todos = entry.meta && entry.meta.todos;
    if (kind === "todos" && Array.isArray(todos)) {
      const list = element("ul", "checklist");
      for (const todo of todos) {
        const line = element("li", `todo todo-${["pending", "in_progress", "completed", "cancelled"]
          .includes(todo.status) ? todo.status : "other"}`);
        const box = element("input");
        box.type = "checkbox";
        box.disabled = true;
        box.checked = todo.status === "completed";
        line.append(box, element("span", "todo-text", String(todo.content)),
          element("span", "todo-status", String(todo.status).replace("_", " ")));
        list.append(line);
      }
      // The text is the same plan in brackets; shown only when it says more ("Plan cancelled").
      if (!String(entry.text).startsWith("[")) item.append(element("p", "text", entry.text));
      item.append(list);
    } else if (kind === "tool") {
      const pre = element("pre", "text");
      pre.append(element("code", null, entry.text));
      item.append(pre);
    } else {
      item.append(element("p", "text", entry.text));
    }
    if (entry.meta && entry.meta.dropped_by_stop) {
      const by = entry.meta.dropped_by_interrupt != null
        ? `an interrupt (message ${entry.meta.dropped_by_interrupt})` : "a stop";
      const note = element("p", "dropped", `not run: dropped by ${by}`);
      if (entry.meta.resent_as != null) {
        note.append(` — sent again as ${entry.meta.resent_as}`);
      } else if (who === "human") {
        const again = element("button", "run-again", "Run again");
        again.type = "button";
        again.dataset.seq = String(entry.seq);
        note.append(" ", again);
      }
      item.append(note);
    }
    if (entry.meta && entry.meta.cut_off) {
      item.append(element("p", "cut-off", `saved as it stood: cut off by the ${entry.meta.cut_off}`));
    }
    return item;
  }

  // Text an agent is writing now: shown at once, greyed and marked unsaved, until the entry
  // that saves it (which names the draft in meta.draft) takes its place.
  function renderDraft(draft) {
    const item = element("li", "entry kind-message author-agent draft");
    item.dataset.draft = String(draft.draft);
    item.dataset.state = "draft";
    const head = element("div", "head");
    head.append(element("span", "author", draft.author), element("span", "kind", "writing… (not saved yet)"),
      element("time", "time", clock(draft.ts)));
    item.append(head, element("p", "text", draft.text));
    return item;
  }

  function channelView() {
    const channel = body.dataset.channel;
    const path = `/v1/channels/${encodeURIComponent(channel)}`;
    const transcript = document.getElementById("transcript");
    let last = 0; // the last entry shown: where a reconnect resumes
    const shown = new Set();
    const drafts = new Map(); // draft id -> its element, until the saved entry replaces it
    const saved = new Set(); // drafts whose entry came: a late draft of them is not shown again
    // The newest entries and the send box are what a person looks at: the page stays at the
    // end as entries come, until they scroll up to read (and again once back at the end).
    let pinned = true;
    const atEnd = () => window.innerHeight + window.scrollY >= document.body.scrollHeight - 40;
    window.addEventListener("scroll", () => { pinned = atEnd(); }, { passive: true });
    function place(item, old) {
      if (old) old.replaceWith(item);
      else transcript.append(item);
      if (pinned) document.getElementById("send").scrollIntoView({ block: "end" });
    }
    const stream = follow(
      () => `${path}/events?after=${last}&drafts=1`,
      {
        message: (event) => {
          const entry = JSON.parse(event.data);
          // Already shown: a reconnect never duplicates. (Not "seq <= last": in a fleet the
          // stream comes in commit order, and another host's seq can be the lower one.)
          if (shown.has(entry.seq)) return;
          shown.add(entry.seq);
          last = entry.seq;
          const id = entry.meta && entry.meta.draft;
          const old = id ? drafts.get(id) : undefined;
          if (id) {
            drafts.delete(id);
            saved.add(id);
          }
          place(renderEntry(entry), old);
          transcript.dispatchEvent(new Event("corral-entry"));
          if (entry.meta && entry.meta.usage) refreshSpend();
          // A stop's (or an interrupt's) notice names the messages it dropped: shown before it,
          // they say so now (an interrupt is a stop of one lane: its mark is the interrupting message).
          for (const seq of (entry.kind === "notice" && entry.meta && entry.meta.dropped_entries) || []) {
            const item = transcript.querySelector(`li[data-seq="${Number(seq)}"]`);
            if (item && !item.querySelector(".dropped")) {
              const by = entry.meta.stop_seq ?? entry.meta.interrupted_by;
              const meta = { ...item.__entry.meta, dropped_by_stop: by,
                ...(entry.meta.stop_seq == null ? { dropped_by_interrupt: by } : {}) };
              place(renderEntry({ ...item.__entry, meta }), item);
            }
          }
        },
        // A reconnect: a draft shown before it was either saved (its entry comes again, after
        // `last`, and replaces it) or lost with the daemon; it never passes for saved.
        open: () => {
          for (const item of drafts.values()) {
            item.dataset.state = "interrupted";
            item.querySelector(".kind").textContent = "not saved (the connection was lost while it was written)";
          }
        },
        draft: (event) => {
          const draft = JSON.parse(event.data);
          if (saved.has(draft.draft)) return;
          const item = renderDraft(draft);
          place(item, drafts.get(draft.draft));
          drafts.set(draft.draft, item);
        },
      },
      () => probeUrl(`${path}/entries?after=${last}&limit=1`),
    );

    // Today's spend (UTC) of the channel, per agent: the lines corral sums (GET /v1/usage), read
    // at load and after each turn's usage line.
    const spend = document.getElementById("spend");
    async function refreshSpend() {
      let days;
      try {
        const response = await fetch(`/v1/usage?channel=${encodeURIComponent(channel)}`, { cache: "no-store" });
        if (!response.ok) return;
        days = (await response.json()).days;
      } catch (err) {
        return;
      }
      const many = days.length > 1;
      spend.textContent = days.length === 0 ? "Today (UTC): nothing spent yet"
        : `Today (UTC): ${days.map((row) => (many ? `${row.agent}: ${row.line}` : row.line)).join("; ")}`;
    }
    refreshSpend();

    stopButton(document.getElementById("stop"), document.getElementById("ack"), `${path}/stop`, (result) => {
      const ms = result.elapsed_ms.toFixed(1);
      if (result.repeat) return ["repeat", `Already stopped: nothing new ran since the last stop (a repeat; ${ms} ms).`];
      return ["stopped", `Stopped in ${ms} ms: ${counts(result)}`];
    });

    // Start over: refused while a turn runs (the answer says so); a second press then stops
    // the turn and starts over. Nothing is done without the server's word on it.
    const reset = document.getElementById("reset");
    const ack = document.getElementById("ack");
    let armed = false;
    reset.addEventListener("click", async () => {
      reset.disabled = true;
      showAck(ack, "pending", armed ? "Stopping, then starting over…" : "Starting over…");
      try {
        const { response, result } = await post(`${path}/reset`, { stop: armed });
        if (response.ok) {
          armed = false;
          reset.textContent = "Start over";
          showAck(ack, "stopped", result.text);
        } else if (response.status === 409) {
          armed = true;
          reset.textContent = "Stop and start over";
          showAck(ack, "repeat", "A turn is running here: press “Stop and start over” to stop it first.");
        } else {
          showAck(ack, "failed", `Not started over: ${result ? apiError(result, response) : response.status}`);
        }
      } catch (err) {
        showAck(ack, "failed", `Not started over: the daemon did not answer (${err.message})`);
      } finally {
        reset.disabled = false;
      }
    });

    // Run again: a message a stop dropped, sent again once (the server refuses a second time).
    transcript.addEventListener("click", async (event) => {
      const again = event.target.closest("button.run-again");
      if (!again) return;
      again.disabled = true;
      const seq = Number(again.dataset.seq);
      try {
        const { response, result } = await post(`${path}/resend`, { seq });
        if (response.ok) {
          again.replaceWith(`sent again as ${result.seq}`);
          stream.now();
        } else {
          again.replaceWith(`not sent again: ${result ? apiError(result, response) : response.status}`);
        }
      } catch (err) {
        again.disabled = false;
        showAck(ack, "failed", `Not sent again: the daemon did not answer (${err.message})`);
      }
    });

    // The queue under the transcript: what waits, each with a ✕ that takes it back. Read from
    // the API after every entry and every second (a turn's start stores no entry).
    const waiting = document.getElementById("waiting");
    const queue = document.getElementById("queue");
    async function refreshQueue() {
      let view;
      try {
        const response = await fetch(`${path}/queue`, { cache: "no-store" });
        if (!response.ok) return;
        view = await response.json();
      } catch (err) {
        return;
      }
      const items = view.queued.map((row) => {
        const item = element("li", "waiting-message");
        item.dataset.seq = String(row.entry);
        const age = row.age == null ? "" : ` · ${Math.round(row.age)} s`;
        item.append(element("span", "place", `#${row.place}`), " ",
          element("span", "who", `seq ${row.entry} · ${row.author.replace(/^human:/, "")} → ${row.agent}${age}`), " ",
          element("span", "why", row.why), " ", element("span", "text", row.text));
        const cancel = element("button", "take-back", "✕");
        cancel.type = "button";
        cancel.dataset.seq = String(row.entry);
        cancel.setAttribute("aria-label", `Take back seq ${row.entry}`);
        cancel.title = "Take it back: it will not run";
        item.append(" ", cancel);
        return item;
      });
      queue.replaceChildren(...items);
      waiting.hidden = items.length === 0;
    }
    queue.addEventListener("click", async (event) => {
      const cancel = event.target.closest("button.take-back");
      if (!cancel) return;
      cancel.disabled = true;
      try {
        const response = await fetch(`${path}/queue/${Number(cancel.dataset.seq)}`, { method: "DELETE", cache: "no-store" });
        let result = null;
        try {
          result = await response.json();
        } catch (err) {
          result = null;
        }
        if (response.ok) showAck(ack, "stopped", `Taken back: seq ${result.seq} will not run.`);
        else showAck(ack, "failed", `Not taken back: ${result ? apiError(result, response) : response.status}`);
      } catch (err) {
        showAck(ack, "failed", `Not taken back: the daemon did not answer (${err.message})`);
      }
      refreshQueue();
    });
    refreshQueue();
    setInterval(refreshQueue, 1000);
    transcript.addEventListener("corral-entry", refreshQueue);

    const form = document.getElementById("send");
    const field = document.getElementById("message");
    const agent = document.getElementById("agent");
    const delivery = document.getElementById("delivery");
    const error = document.getElementById("send-error");
    const submit = form.querySelector("button[type=submit]");
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      const text = field.value;
      if (!text.trim()) return;
      submit.disabled = true;
      try {
        const body = agent.value ? { text, to: [agent.value] } : { text };
        if (delivery.value) body.delivery = delivery.value;
        const { response, result } = await post(`${path}/messages`, body);
        if (response.ok) {
          field.value = "";
          // A steer that could not be handed to the turn was queued: say why, as the API does.
          error.textContent = result && result.fallback ? `Queued, not steered: ${result.fallback}` : "";
          stream.now();
        } else {
          error.textContent = `Not sent: ${result ? apiError(result, response) : response.status}`;
        }
      } catch (err) {
        error.textContent = `Not sent: the daemon did not answer (${err.message})`;
      } finally {
        submit.disabled = false;
      }
    });
    field.addEventListener("keydown", (event) => {
      if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) form.requestSubmit();
    });
  }

  // ------------------------------------------------------------------ the channel list

  function describeAgent(agent) {
    return describeState(agent) + (agent.network ? ` (network: ${agent.network})` : "");
  }

  function describeState(agent) {
    const name = agent.agent ? `${agent.agent}: ` : "";
    const queued = agent.queued ? `, ${agent.queued} queued` : "";
    if (agent.state === "running") {
      const since = agent.since ? ` since ${clock(agent.since)}` : "";
      return `${name}running${since}${queued}`;
    }
    if (agent.state === "stopping") return `${name}stopping${queued}`;
    if (agent.state === "queued") {
      const waiting = agent.waiting ? `, waiting #${agent.waiting.position} (${agent.waiting.why})` : "";
      return `${name}queued ${agent.queued}${waiting}`;
    }
    return `${name}idle`;
  }

  function listView() {
    const tbody = document.querySelector("#channels tbody");
    const running = document.getElementById("running");
    const waiting = document.getElementById("waiting");
    const empty = document.getElementById("empty");
    const rows = new Map(); // channel name -> {row, cell, shown}

    function row(name) {
      let known = rows.get(name);
      if (!known) {
        const tr = element("tr");
        const link = element("a", null, name);
        link.href = `/dashboard/channels/${encodeURIComponent(name)}`;
        const th = element("th");
        th.scope = "row";
        th.append(link);
        const cell = element("td", "agents");
        tr.append(th, cell);
        known = { row: tr, cell, shown: "" };
        rows.set(name, known);
      }
      return known;
    }

    function render(view) {
      running.textContent = String(view.running);
      waiting.textContent = view.waiting
        ? `, ${view.waiting} waiting for a slot (at most ${view.max_turns} turns at once)` : "";
      const names = new Set();
      view.channels.forEach((channel, index) => {
        names.add(channel.name);
        const known = row(channel.name);
        const shown = JSON.stringify(channel.agents);
        if (known.shown !== shown) {
          const list = element("ul", "agent-states");
          for (const agent of channel.agents) {
            const line = element("li", "agent-state", describeAgent(agent));
            line.dataset.state = ["idle", "queued", "running", "stopping"].includes(agent.state) ? agent.state : "idle";
            list.append(line);
          }
          known.cell.replaceChildren(list);
          known.shown = shown;
          known.row.dataset.state = channel.agents.some((a) => a.state === "running" || a.state === "stopping")
            ? "running" : "idle";
        }
        if (tbody.children[index] !== known.row) tbody.insertBefore(known.row, tbody.children[index] || null);
      });
      for (const [name, known] of rows) {
        if (!names.has(name)) {
          known.row.remove();
          rows.delete(name);
        }
      }
      empty.hidden = view.channels.length > 0;
      body.dataset.rendered = String(view.channels.length);
      // A page of a host with many channels: busy ones first; say what it leaves out.
      const idle = view.idle || 0;
      more.hidden = !idle && !view.next;
      moreText.textContent = idle ? `${plural(idle, "idle channel", "idle channels")} not listed (of ${view.total}).`
        : view.next ? `More channels (${view.total} in all).` : "";
      moreIdle.hidden = !idle;
      moreNext.hidden = !view.next;
      if (view.next) {
        const next = new URLSearchParams(query);
        next.set("after", view.next);
        moreNext.href = `?${next}`;
      }
    }

    const query = new URLSearchParams(location.search);
    const asked = new URLSearchParams();
    for (const key of ["idle", "after"]) if (query.get(key)) asked.set(key, query.get(key));
    const more = document.getElementById("more");
    const moreText = document.getElementById("more-text");
    const moreIdle = document.getElementById("more-idle");
    const moreNext = document.getElementById("more-next");
    follow(() => `/dashboard/events${asked.toString() ? `?${asked}` : ""}`, { status: (event) => render(JSON.parse(event.data)) },
      () => probeUrl("/v1/status"));

    stopButton(document.getElementById("stop-all"), document.getElementById("ack"), "/v1/stop", (result) => {
      const ms = result.elapsed_ms.toFixed(1);
      const stopped = result.channels || [];
      if (stopped.length === 0) return ["repeat", "Nothing was running: no channel had work to stop."];
      return ["stopped", `Stopped ${plural(stopped.length, "channel", "channels")} in ${ms} ms: ${counts(result)}`];
    });
  }

  setConnection("connecting");
  if (body.dataset.view === "channel") channelView();
  else listView();
})();
