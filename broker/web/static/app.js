// The page: the session list, one session's events, approvals, steering, the command box.
// Everything shown comes from the daemon's events (see render.js: text only, never HTML).
"use strict";

const { el, visible, markdown, Ansi, fileChange, shellJoin } = Render;
const CSRF = document.querySelector('meta[name="sluice-csrf"]').content;
// Events kept on the page per session view; older ones are dropped from the top as new
// ones come (and fetched again on scrolling up).
const PAGE_EVENTS = 4000;
// A command's raw output kept for its terminal view, the newest bytes, at most.
const TERMINAL_BYTES = 1 << 20;
// What a typing event shows of the text typed (characters), and how many such lines the
// terminal view keeps under the terminal.
const TYPED_SHOWN = 200;
const TYPED_LINES = 5;
const KEYS = { "ctrl-c": "\u0003", "ctrl-d": "\u0004" };

async function post(path, body) {
  const res = await fetch(path, {
    method: "POST",
    headers: { "content-type": "application/json", "x-sluice-csrf": CSRF },
    body: JSON.stringify(body || {}),
  });
  const data = await res.json().catch(() => ({}));
  if (!res.ok) throw new Error(data.error || res.status + " " + res.statusText);
  return data;
}

function status(text, bad) {
  const bar = document.getElementById("status");
  bar.textContent = text;
  bar.className = bad ? "bad" : "";
}

function age(seconds) {
  seconds = Math.max(0, Math.floor(seconds));
  for (const [unit, size] of [["d", 86400], ["h", 3600], ["m", 60]]) if (seconds >= size) return Math.floor(seconds / size) + unit;
  return seconds + "s";
}

// Typed text on one line for people, as sluice attach shows it: control characters as
// escapes (\n, \x03), what visible() catches besides made visible, at most TYPED_SHOWN characters.
const NAMED = { "\n": "\\n", "\t": "\\t", "\r": "\\r" };
function typedText(text, omitted) {
  const flat = visible(text.replace(/[\u0000-\u001f\u007f-\u009f]/g,
    (c) => NAMED[c] || "\\x" + c.charCodeAt(0).toString(16).padStart(2, "0")));
  const more = Math.max(0, flat.length - TYPED_SHOWN) + (omitted || 0);
  return flat.slice(0, TYPED_SHOWN) + (more ? "\u2026 (+" + more + " characters)" : "");
}

function fromBase64(text) {
  const binary = atob(text);
  const bytes = new Uint8Array(binary.length);
  for (let i = 0; i < binary.length; i++) bytes[i] = binary.charCodeAt(i);
  return bytes;
}

// A hidden tab gets no animation frames: it renders on a timer instead.
function nextFrame(fn) {
  if (document.hidden) setTimeout(fn, 250);
  else requestAnimationFrame(fn);
}

// -- the session list --------------------------------------------------------------

const STATE_WORDS = { idle: "idle", running: "running", waiting_for_approval: "waiting for approval" };

function watchSessions() {
  const source = new EventSource("/api/sessions/stream");
  source.addEventListener("sessions", (e) => {
    const data = JSON.parse(e.data).list;
    data.now = JSON.parse(e.data).now;
    status("connected to the daemon (" + data.sessions.length + " sessions)");
    const list = document.getElementById("sessions");
    list.replaceChildren();
    data.sessions.sort((a, b) => b.created - a.created);
    for (const s of data.sessions) {
      const item = el("a", "session" + (current && current.id === s.id ? " current" : ""));
      item.href = "#/s/" + encodeURIComponent(s.id);
      item.dataset.id = s.id;
      item.append(el("span", "sid", s.id.slice(0, 8)), el("span", "state state-" + s.state, STATE_WORDS[s.state] || s.state));
      const meta = el("div", "meta", visible(
        (s.model || "-") + " \u00b7 " + s.frontends.length + " attached \u00b7 " + age(data.now - s.created) + " \u00b7 " + s.cwd));
      item.append(meta);
      list.append(item);
    }
    if (!data.sessions.length) list.append(el("p", "empty", "no sessions"));
  });
  source.addEventListener("unavailable", (e) => status("daemon unreachable: " + JSON.parse(e.data).list.message + " (retrying)", true));
  source.onerror = () => status("the web server is unreachable (retrying)", true);
}

// -- one session -------------------------------------------------------------------

class SessionView {
  constructor(id) {
    this.id = id;
    this.log = document.getElementById("log");
    this.log.replaceChildren();
    this.calls = new Map(); // call_id -> {out, ansi: {1, 2}, decoder}
    this.approvals = new Map(); // call_id -> card
    this.raw = new Map(); // call_id -> {chunks: [Uint8Array], size, command}: for the terminal view
    this.terminal = null; // {callId, term, typing} while the terminal view is open
    this.mine = new Set(); // submission ids of what this page typed: their errors show by the terminal
    this.errors = new Map(); // the latest error events by submission id (one may come before its POST's answer)
    this.sending = Promise.resolve(); // typed input goes out in order, one request at a time
    this.first = null; // the oldest seq on the page
    this.last = 0; // the newest seq received
    this.log.dataset.gaps = 0;
    delete this.log.dataset.last;
    this.count = 0;
    this.loadingEarlier = false;
    this.source = new EventSource("/api/sessions/" + encodeURIComponent(id) + "/events");
    this.source.addEventListener("attached", (e) => this.attached(JSON.parse(e.data)));
    // Batches are rendered once a frame, together: a fast stream costs one layout a frame.
    this.queued = [];
    this.source.addEventListener("events", (e) => {
      if (!this.queued.length) nextFrame(() => { const q = this.queued; this.queued = []; this.events(q.flat()); });
      this.queued.push(JSON.parse(e.data));
    });
    this.source.addEventListener("gone", (e) => { this.note("error", JSON.parse(e.data).message); this.source.close(); });
    this.source.addEventListener("unavailable", (e) => this.note("error", "daemon unreachable: " + JSON.parse(e.data).message + " (reconnecting)"));
    this.onScroll = () => { if (this.log.scrollTop < 40) this.earlier(); };
    this.log.addEventListener("scroll", this.onScroll);
    document.getElementById("session-title").textContent = id;
  }

  close() {
    this.closeTerminal();
    this.source.close();
    this.log.removeEventListener("scroll", this.onScroll);
  }

  attached(info) {
    document.getElementById("session-title").textContent = visible(info.id + "  \u00b7  " + (info.model || "") + "  \u00b7  " + info.cwd);
    if (this.first === null && info.since > 1) this.first = info.since;
  }

  note(cls, text) {
    this.log.append(el("div", "note " + cls, visible(text)));
  }

  events(batch, where) {
    const stick = this.log.scrollHeight - this.log.scrollTop - this.log.clientHeight < 60;
    const frag = document.createDocumentFragment();
    for (const event of batch) {
      if (where !== "top" && event.seq) {
        // The stream numbers events without gaps; after a reconnect it resumes at the next.
        if (this.last && event.seq <= this.last) continue;
        if (this.last && event.seq !== this.last + 1) this.log.dataset.gaps = Number(this.log.dataset.gaps || 0) + 1;
        this.last = event.seq;
        this.log.dataset.last = event.seq;
      }
      if (this.first === null) this.first = event.seq;
      const node = this.render(event);
      if (node) {
        node.dataset.seq = event.seq;
        frag.append(node);
        this.count++;
      }
    }
    if (where === "top") {
      const before = this.log.scrollHeight;
      this.log.prepend(frag);
      this.log.scrollTop += this.log.scrollHeight - before;
    } else {
      this.log.append(frag);
      while (this.count > PAGE_EVENTS && this.log.firstChild) {
        this.log.firstChild.remove();
        this.count--;
        this.first = Number(this.log.firstChild && this.log.firstChild.dataset.seq) || this.first;
      }
      if (stick) this.log.scrollTop = this.log.scrollHeight;
    }
    // Earlier events fill a log too short to scroll (the tail may be mostly deltas).
    if (this.log.scrollHeight <= this.log.clientHeight + 40) this.earlier();
  }

  async earlier() {
    if (this.loadingEarlier || !this.first || this.first <= 1) return;
    this.loadingEarlier = true;
    const last = this.first - 1;
    const first = Math.max(1, last - 999);
    try {
      const res = await fetch(`/api/sessions/${encodeURIComponent(this.id)}/range?first=${first}&last=${last}`);
      if (res.ok) {
        const batch = await res.json();
        this.first = first;
        this.events(batch, "top");
      }
    } finally {
      this.loadingEarlier = false;
    }
  }

  block(cls, label) {
    const box = el("div", "ev " + cls);
    if (label) box.append(el("div", "label", label));
    return box;
  }

  render(event) {
    const m = event.msg;
    switch (m.type) {
      case "session_configured":
        return this.block("meta", visible("session configured \u00b7 model " + m.model));
      case "task_started":
        return this.block("turn", "turn started");
      case "task_complete":
        return this.block("turn", "turn complete");
      case "turn_aborted":
        return this.block("turn aborted", "turn aborted (" + m.reason + ")");
      case "user_message": {
        const box = this.block("user", "you");
        box.append(markdown(m.message));
        return box;
      }
      case "agent_message": {
        const box = this.block("agent", "agent");
        box.append(markdown(m.message));
        return box;
      }
      case "agent_reasoning":
      case "agent_reasoning_raw_content": {
        const box = el("details", "ev reasoning");
        box.append(el("summary", null, "reasoning"), el("pre", "text", visible(m.text)));
        return box;
      }
      case "plan_update": {
        const box = this.block("plan", "plan");
        if (m.explanation) box.append(markdown(m.explanation));
        const list = el("ul", "plan");
        for (const item of m.plan) list.append(el("li", "step-" + item.status, visible(item.step)));
        box.append(list);
        return box;
      }
      case "exec_command_begin": {
        const box = this.block("command");
        box.append(el("div", "cmd", visible("$ " + shellJoin(m.command))), el("div", "cwd", visible(m.cwd)));
        const out = el("pre", "output");
        const watch = el("button", "watch", "terminal view");
        watch.addEventListener("click", () => this.openTerminal(m.call_id));
        box.firstChild.prepend(watch);
        box.append(out);
        this.calls.set(m.call_id, { box, out, ansi: new Ansi(out), decoder: new TextDecoder("utf-8") });
        this.raw.set(m.call_id, { chunks: [], size: 0, command: shellJoin(m.command), typed: [] });
        return box;
      }
      case "exec_command_output_delta": {
        let call = this.calls.get(m.call_id);
        if (!call) {
          const node = this.render({ msg: { type: "exec_command_begin", call_id: m.call_id, command: ["(earlier)"], cwd: "" } });
          call = this.calls.get(m.call_id);
          call.orphan = node;
        }
        const bytes = fromBase64(m.chunk);
        call.ansi.write(call.decoder.decode(bytes, { stream: true }));
        this.keepRaw(m.call_id, bytes);
        if (call.orphan) { const node = call.orphan; call.orphan = null; return node; }
        return null;
      }
      case "exec_command_end": {
        if (this.terminal && this.terminal.callId === m.call_id) this.terminalEnded();
        const call = this.calls.get(m.call_id);
        const secs = m.duration ? (m.duration.secs + m.duration.nanos / 1e9).toFixed(2) : "?";
        const end = el("div", "exit " + (m.exit_code === 0 ? "ok" : "failed"), "exit " + m.exit_code + " \u00b7 " + secs + " s");
        if (call) {
          call.box.append(end);
          if (call.out.textContent.split("\n").length > 40) {
            call.box.classList.add("folded");
            const more = el("button", "unfold", "show all output");
            more.addEventListener("click", () => { call.box.classList.remove("folded"); more.remove(); });
            call.box.append(more);
          }
          this.calls.delete(m.call_id);
          return null;
        }
        const box = this.block("command", null);
        box.append(el("pre", "output", visible(m.aggregated_output || m.stdout + m.stderr)), end);
        return box;
      }
      case "exec_approval_request":
      case "apply_patch_approval_request":
        return this.approvalCard(event);
      case "approval_resolved": {
        const card = this.approvals.get(m.call_id);
        const text = visible(m.decision + " by " + m.by);
        if (card) {
          card.classList.add("resolved");
          card.querySelector(".answers").replaceChildren(el("span", "answered", text));
        }
        return this.block("meta", "approval " + text);
      }
      case "patch_apply_begin": {
        const box = this.block("patch", m.auto_approved ? "patch (auto-approved)" : "patch");
        for (const [path, change] of Object.entries(m.changes)) box.append(fileChange(path, change));
        return box;
      }
      case "patch_apply_end":
        return this.block(m.success ? "meta" : "error", visible((m.success ? "patch applied" : "patch failed") + (m.stderr ? ": " + m.stderr : "")));
      case "turn_diff": {
        const box = el("details", "ev diffbox");
        const pre = el("pre", "diff");
        pre.append(Render.diff(m.unified_diff));
        box.append(el("summary", null, "the turn's diff"), pre);
        return box;
      }
      case "mcp_tool_call_begin": {
        const box = this.block("mcp", visible("MCP tool " + m.server + "." + m.tool));
        if (m.arguments != null) box.append(el("pre", "text", visible(JSON.stringify(m.arguments, null, 2))));
        return box;
      }
      case "mcp_tool_call_end": {
        const box = this.block("mcp", m.success ? "MCP call done" : "MCP call failed");
        if (m.result) box.append(el("pre", "text", visible(JSON.stringify(m.result, null, 2))));
        return box;
      }
      case "token_count":
        return this.block("tokens", "tokens: " + m.input_tokens + " in, " + m.output_tokens + " out, " + m.total_tokens + " total");
      case "exec_command_stdin_typed": {
        const text = visible(m.by + " typed into " + m.call_id + ": " + typedText(m.stdin, m.omitted));
        const raw = this.raw.get(m.call_id);
        if (raw) {
          raw.typed.push(text);
          if (raw.typed.length > TYPED_LINES) raw.typed.shift();
        }
        if (this.terminal && this.terminal.callId === m.call_id) this.showTyped(raw ? raw.typed : [text]);
        return this.block("typed", text);
      }
      case "error":
        this.errors.set(event.id, m.message);
        if (this.errors.size > 20) this.errors.delete(this.errors.keys().next().value);
        if (this.mine.has(event.id)) this.typingError(m.message);
        return this.block("error", visible("error: " + m.message));
      case "background_event":
        return this.block("meta", visible(m.message));
      case "shutdown_complete":
        return this.block("turn", "session shut down");
      case "agent_message_delta":
      case "agent_reasoning_delta":
      case "agent_reasoning_raw_content_delta":
        return null; // the whole message follows
      default:
        return this.block("meta", visible(m.type));
    }
  }

  keepRaw(callId, bytes) {
    const raw = this.raw.get(callId);
    if (!raw) return;
    raw.chunks.push(bytes);
    raw.size += bytes.length;
    while (raw.size > TERMINAL_BYTES && raw.chunks.length > 1) raw.size -= raw.chunks.shift().length;
    if (this.terminal && this.terminal.callId === callId) this.terminal.term.write(bytes);
  }

  // The command's output in a real terminal (xterm.js): what an interactive session
  // (exec_command) draws, cursor movements and all, as a terminal shows it. Read-only
  // until the person turns typing on (the terminal's own keyboard stays off: input goes
  // out a line at a time from the field below it, so every frontend sees it as sent).
  openTerminal(callId) {
    this.closeTerminal();
    const raw = this.raw.get(callId);
    if (!raw) return;
    const panel = document.getElementById("terminal-panel");
    const screen = document.getElementById("terminal");
    screen.replaceChildren();
    panel.hidden = false;
    const term = new Terminal({ disableStdin: true, convertEol: false, scrollback: 5000, rows: 24, cols: 100,
                                fontSize: 13, theme: { background: "#0f1419" } });
    term.open(screen);
    for (const chunk of raw.chunks) term.write(chunk);
    this.terminal = { callId, term, typing: false, command: raw.command };
    this.showTyped(raw.typed);
    document.getElementById("terminal-type").disabled = !this.calls.has(callId);
    this.setTyping(false);
  }

  closeTerminal() {
    if (!this.terminal) return;
    this.setTyping(false);
    this.terminal.term.dispose();
    this.terminal = null;
    document.getElementById("terminal-panel").hidden = true;
  }

  // Who typed what into the command, the latest TYPED_LINES, under its terminal.
  showTyped(lines) {
    document.getElementById("terminal-typed").replaceChildren(...lines.map((text) => el("div", null, text)));
  }

  // Typing into the command is an explicit act: off whenever a terminal view opens.
  setTyping(on) {
    const t = this.terminal;
    if (!t) return;
    t.typing = on;
    const button = document.getElementById("terminal-type");
    button.setAttribute("aria-pressed", String(on));
    button.textContent = on ? "Stop typing" : "Type into this command";
    document.getElementById("terminal-input").hidden = !on;
    document.getElementById("terminal-note").textContent = "";
    document.getElementById("terminal-title").textContent =
      visible("$ " + t.command + (on ? "  (typing on: input goes to the command)" : "  (read-only)"));
    if (on) document.getElementById("terminal-line").focus();
  }

  terminalEnded() {
    this.setTyping(false);
    document.getElementById("terminal-type").disabled = true;
    document.getElementById("terminal-title").textContent = visible("$ " + this.terminal.command + "  (ended)");
  }

  // Sent in order: each request waits for the one before it.
  type(text) {
    const t = this.terminal;
    if (!t || !t.typing || !text) return;
    const path = `/api/sessions/${encodeURIComponent(this.id)}/stdin`;
    this.sending = this.sending.then(async () => {
      try {
        const answer = await post(path, { call_id: t.callId, text });
        this.mine.add(answer.id);
        if (this.errors.has(answer.id)) this.typingError(this.errors.get(answer.id));
      } catch (err) {
        this.typingError(err.message);
      }
    });
  }

  typingError(message) {
    if (this.terminal) document.getElementById("terminal-note").textContent = visible("not typed: " + message);
  }

  approvalCard(event) {
    const m = event.msg;
    const isExec = m.type === "exec_approval_request";
    const card = this.block("approval", isExec ? "approve this command?" : "approve this patch?");
    if (isExec) {
      card.append(el("pre", "cmd", visible("$ " + shellJoin(m.command))), el("div", "cwd", visible("in " + m.cwd)));
      if (m.stdin != null) card.append(el("div", "label", "input for the running session:"), el("pre", "cmd", visible(m.stdin)));
    } else {
      for (const [path, change] of Object.entries(m.changes)) card.append(fileChange(path, change));
      if (m.grant_root) card.append(el("div", "cwd", visible("and allow writes under " + m.grant_root + " for the rest of the session")));
    }
    if (m.reason) {
      const why = el("div", "reason");
      why.append(el("span", "who", "the model says: "), el("span", null, visible(m.reason)));
      card.append(why);
    }
    const answers = el("div", "answers");
    for (const [decision, label] of [["approved", "Yes"], ["approved_for_session", "Always (this session)"], ["denied", "No"], ["abort", "No, and stop"]]) {
      const b = el("button", "answer " + decision, label);
      b.dataset.decision = decision;
      b.addEventListener("click", async () => {
        answers.querySelectorAll("button").forEach((x) => (x.disabled = true));
        try {
          await post(`/api/sessions/${encodeURIComponent(this.id)}/approval`, { kind: isExec ? "exec" : "patch", id: event.id, decision });
        } catch (err) {
          status("answer failed: " + err.message, true);
          answers.querySelectorAll("button").forEach((x) => (x.disabled = false));
        }
      });
      answers.append(b);
    }
    card.append(answers);
    this.approvals.set(m.call_id, card);
    return card;
  }
}

let current = null;

function show(view) {
  for (const v of document.querySelectorAll(".view")) v.hidden = v.id !== view;
}

function route() {
  const match = location.hash.match(/^#\/s\/(.+)$/);
  if (current) { current.close(); current = null; }
  if (match) {
    show("session-view");
    current = new SessionView(decodeURIComponent(match[1]));
  } else if (location.hash === "#/run") {
    show("run-view");
  } else {
    show("new-view");
  }
  for (const item of document.querySelectorAll(".session")) item.classList.toggle("current", !!current && item.dataset.id === current.id);
}

// -- forms ---------------------------------------------------------------------------

function wire() {
  document.getElementById("send").addEventListener("submit", async (e) => {
    e.preventDefault();
    const box = document.getElementById("message");
    if (!current || !box.value.trim()) return;
    try {
      await post(`/api/sessions/${encodeURIComponent(current.id)}/input`, { text: box.value });
      box.value = "";
    } catch (err) { status("sending failed: " + err.message, true); }
  });
  document.getElementById("interrupt").addEventListener("click", async () => {
    if (current) await post(`/api/sessions/${encodeURIComponent(current.id)}/interrupt`).catch((err) => status(err.message, true));
  });
  document.getElementById("shutdown").addEventListener("click", async () => {
    if (current && confirm("Shut this session down?")) {
      await post(`/api/sessions/${encodeURIComponent(current.id)}/shutdown`).catch((err) => status(err.message, true));
    }
  });
  document.getElementById("new").addEventListener("submit", async (e) => {
    e.preventDefault();
    const f = e.target.elements;
    const out = document.getElementById("new-result");
    out.textContent = "starting\u2026";
    try {
      const data = await post("/api/sessions", {
        cwd: f.cwd.value, model: f.model.value, approval: f.approval.value, sandbox: f.sandbox.value, prompt: f.prompt.value,
      });
      out.textContent = "";
      location.hash = "#/s/" + encodeURIComponent(data.session);
    } catch (err) { out.textContent = visible(err.message); }
  });
  document.getElementById("run").addEventListener("submit", runCommand);
  document.getElementById("terminal-close").addEventListener("click", () => current && current.closeTerminal());
  document.getElementById("terminal-type").addEventListener("click", () => {
    if (current && current.terminal) current.setTyping(!current.terminal.typing);
  });
  document.getElementById("terminal-input").addEventListener("submit", (e) => {
    e.preventDefault();
    const line = document.getElementById("terminal-line");
    if (current) current.type(line.value + "\n");
    line.value = "";
  });
  for (const key of document.querySelectorAll("#terminal-input [data-key]")) {
    key.addEventListener("click", () => current && current.type(KEYS[key.dataset.key]));
  }
}

let running = null;

async function runCommand(e) {
  e.preventDefault();
  const f = e.target.elements;
  const out = document.getElementById("run-output");
  if (running) { running.abort(); return; }
  out.replaceChildren();
  const ansi = { 1: new Ansi(out), 2: new Ansi(out) };
  running = new AbortController();
  f.go.textContent = "Cancel";
  try {
    const res = await fetch("/api/run", {
      method: "POST", signal: running.signal,
      headers: { "content-type": "application/json", "x-sluice-csrf": CSRF },
      body: JSON.stringify({
        command: f.command.value, cwd: f.cwd.value, sandbox: f.sandbox.value,
        writable: f.writable.value.split("\n").map((s) => s.trim()).filter(Boolean), network: f.network.checked,
      }),
    });
    if (!res.ok) throw new Error((await res.json().catch(() => ({}))).error || res.statusText);
    const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += value;
      let nl;
      while ((nl = buf.indexOf("\n")) >= 0) {
        const item = JSON.parse(buf.slice(0, nl));
        buf = buf.slice(nl + 1);
        if (item.text !== undefined) ansi[item.stream === 2 ? 2 : 1].write(item.text);
        else if (item.exit) out.append(el("div", "exit " + (item.exit.returncode === 0 ? "ok" : "failed"), visible("exit " + item.exit.returncode + (item.exit.error ? " \u00b7 " + item.exit.error : ""))));
        else if (item.error) out.append(el("div", "exit failed", visible(item.error)));
      }
    }
  } catch (err) {
    out.append(el("div", "exit failed", visible(err.name === "AbortError" ? "cancelled" : err.message)));
  } finally {
    running = null;
    f.go.textContent = "Run";
  }
}

window.addEventListener("hashchange", route);
wire();
watchSessions();
route();
