// Text to DOM, never to HTML: everything the model, a command or an MCP server wrote is
// put on the page with textContent (or as a text node), so no byte of it is ever parsed
// as markup. Markdown, ANSI colours and diffs are rendered by building elements here.
"use strict";

const Render = (() => {
  function el(tag, cls, text) {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined && text !== null) node.textContent = text;
    return node;
  }

  // Control characters made visible (a terminal would act on them; a person should see
  // them): C0 except tab and newline, DEL, and C1, as Unicode control pictures or \xNN.
  function visible(text) {
    return String(text).replace(/[\u0000-\u0008\u000b-\u001f\u007f-\u009f\u200b-\u200f\u202a-\u202e\u2066-\u2069]/g, (c) => {
      const code = c.charCodeAt(0);
      if (code < 0x20) return String.fromCharCode(0x2400 + code);
      if (code === 0x7f) return "\u2421";
      return "\\u" + code.toString(16).padStart(4, "0");
    });
  }

  // -- Markdown: a small subset, rendered as elements ------------------------------

  const SAFE_LINK = /^(https?:\/\/|mailto:)/i;

  function inline(parent, text) {
    // `code`, **bold**, *em*, [label](url): anything else is text.
    const re = /(`+)([^`]+?)\1|\*\*([^*]+)\*\*|\*([^*\s][^*]*)\*|\[([^\]]+)\]\(([^)\s]+)\)/g;
    let at = 0;
    for (const m of text.matchAll(re)) {
      if (m.index > at) parent.append(document.createTextNode(visible(text.slice(at, m.index))));
      if (m[2] !== undefined) parent.append(el("code", null, visible(m[2])));
      else if (m[3] !== undefined) parent.append(el("strong", null, visible(m[3])));
      else if (m[4] !== undefined) parent.append(el("em", null, visible(m[4])));
      else {
        const url = m[6];
        if (SAFE_LINK.test(url)) {
          const a = el("a", null, visible(m[5]));
          a.href = url;
          a.rel = "noopener noreferrer nofollow";
          a.target = "_blank";
          a.title = url;
          parent.append(a);
        } else {
          // javascript:, data: and the like stay text, target and all.
          parent.append(document.createTextNode(visible(m[0])));
        }
      }
      at = m.index + m[0].length;
    }
    if (at < text.length) parent.append(document.createTextNode(visible(text.slice(at))));
  }

  function markdown(text) {
    const root = el("div", "md");
    const lines = String(text).split("\n");
    let i = 0;
    let para = [];
    const flush = () => {
      if (para.length) {
        const p = el("p");
        inline(p, para.join("\n"));
        root.append(p);
        para = [];
      }
    };
    while (i < lines.length) {
      const line = lines[i];
      const fence = line.match(/^\s*(```|~~~)\s*([\w+-]*)/);
      if (fence) {
        flush();
        const body = [];
        i++;
        while (i < lines.length && !lines[i].trimStart().startsWith(fence[1])) body.push(lines[i++]);
        i++;
        const pre = el("pre", "code");
        if (fence[2] === "diff") pre.append(diff(body.join("\n")));
        else pre.textContent = visible(body.join("\n"));
        root.append(pre);
        continue;
      }
      const heading = line.match(/^(#{1,6})\s+(.*)$/);
      if (heading) {
        flush();
        const h = el("h" + Math.min(6, heading[1].length + 2));
        inline(h, heading[2]);
        root.append(h);
        i++;
        continue;
      }
      if (/^\s*([-*+]|\d+[.)])\s+/.test(line)) {
        flush();
        const ordered = /^\s*\d/.test(line);
        const list = el(ordered ? "ol" : "ul");
        while (i < lines.length && /^\s*([-*+]|\d+[.)])\s+/.test(lines[i])) {
          const li = el("li");
          inline(li, lines[i].replace(/^\s*([-*+]|\d+[.)])\s+/, ""));
          list.append(li);
          i++;
        }
        root.append(list);
        continue;
      }
      if (!line.trim()) flush();
      else para.push(line);
      i++;
    }
    flush();
    return root;
  }

  // -- ANSI SGR colours to spans; every other escape sequence dropped ---------------

  const COLOURS = ["black", "red", "green", "yellow", "blue", "magenta", "cyan", "white"];

  // One per output stream: the style carries over from chunk to chunk, and so does an
  // escape sequence cut in two by a chunk boundary.
  class Ansi {
    constructor(target, limit = 256 * 1024) {
      this.target = target;
      this.limit = limit;
      this.size = 0;
      this.trimmed = false;
      this.lastNode = null;
      this.lastClass = null;
      this.style = { fg: null, bg: null, bold: false, dim: false, italic: false, underline: false };
      this.pending = "";
    }

    write(text) {
      text = this.pending + text;
      this.pending = "";
      // An unfinished escape at the end waits for the next chunk (bounded).
      const tail = text.match(/\u001b(\[[0-9;:?<=>]*|\][^\u0007\u001b]*|\u001b?)?$/);
      if (tail && tail[0].length < 4096) {
        this.pending = tail[0];
        text = text.slice(0, tail.index);
      }
      // CSI (SGR kept), OSC (title, clipboard, hyperlinks: dropped with their payload),
      // other two-byte escapes.
      const re = /\u001b\[([0-9;:?<=>]*)([@-~])|\u001b\][^\u0007\u001b]*(\u0007|\u001b\\)|\u001b[PX^_][^\u001b]*\u001b\\|\u001b[@-Z\\-_]|\u009b[0-9;]*[@-~]/g;
      let at = 0;
      for (const m of text.matchAll(re)) {
        if (m.index > at) this.emit(text.slice(at, m.index));
        if (m[2] === "m") this.sgr(m[1]);
        at = m.index + m[0].length;
      }
      if (at < text.length) this.emit(text.slice(at));
    }

    emit(text) {
      text = visible(text.replace(/\r\n/g, "\n").replace(/\r/g, "\n"));
      if (!text) return;
      const s = this.style;
      const classes = [];
      if (s.fg) classes.push("fg-" + s.fg);
      if (s.bg) classes.push("bg-" + s.bg);
      if (s.bold) classes.push("b");
      if (s.dim) classes.push("dim");
      if (s.italic) classes.push("i");
      if (s.underline) classes.push("u");
      const cls = classes.join(" ");
      const last = this.target.lastChild;
      // One node per run of a style, not per chunk: a long output stays a few nodes.
      if (last && this.lastClass === cls && last === this.lastNode && last.textContent.length < 16384) {
        if (cls) last.firstChild.appendData(text);
        else last.appendData(text);
      } else {
        this.lastNode = cls ? el("span", cls, text) : document.createTextNode(text);
        this.lastClass = cls;
        this.target.append(this.lastNode);
      }
      this.size += text.length;
      // Bounded: the oldest output goes once a command has shown more than `limit`.
      while (this.size > this.limit && this.target.firstChild && this.target.firstChild !== this.lastNode) {
        this.size -= this.target.firstChild.textContent.length;
        this.target.firstChild.remove();
        this.trimmed = true;
      }
    }

    sgr(params) {
      const s = this.style;
      const codes = params === "" ? [0] : params.split(/[;:]/).map((n) => parseInt(n, 10) || 0);
      for (let i = 0; i < codes.length; i++) {
        const c = codes[i];
        if (c === 0) Object.assign(s, { fg: null, bg: null, bold: false, dim: false, italic: false, underline: false });
        else if (c === 1) s.bold = true;
        else if (c === 2) s.dim = true;
        else if (c === 3) s.italic = true;
        else if (c === 4) s.underline = true;
        else if (c === 22) s.bold = s.dim = false;
        else if (c === 23) s.italic = false;
        else if (c === 24) s.underline = false;
        else if (c >= 30 && c <= 37) s.fg = COLOURS[c - 30];
        else if (c >= 90 && c <= 97) s.fg = "bright-" + COLOURS[c - 90];
        else if (c === 39) s.fg = null;
        else if (c >= 40 && c <= 47) s.bg = COLOURS[c - 40];
        else if (c >= 100 && c <= 107) s.bg = "bright-" + COLOURS[c - 100];
        else if (c === 49) s.bg = null;
        else if (c === 38 || c === 48) i += codes[i + 1] === 5 ? 2 : 4; // 256 / true colour: skipped
      }
    }
  }

  // -- diffs ---------------------------------------------------------------------------

  function diff(text) {
    const frag = document.createDocumentFragment();
    for (const line of String(text).split("\n")) {
      let cls = "ctx";
      if (line.startsWith("+++") || line.startsWith("---") || line.startsWith("diff ") || line.startsWith("index ")) cls = "file";
      else if (line.startsWith("@@")) cls = "hunk";
      else if (line.startsWith("+")) cls = "add";
      else if (line.startsWith("-")) cls = "del";
      frag.append(el("span", "diff-" + cls, visible(line) + "\n"));
    }
    return frag;
  }

  // A file change of a patch (Codex's FileChange JSON) as a diff.
  function fileChange(path, change) {
    const box = el("div", "file-change");
    const head = el("div", "file-name");
    let body = "";
    if (change === "delete") {
      head.textContent = visible("deleted  " + path);
    } else if (change.add) {
      head.textContent = visible("new file  " + path);
      body = change.add.content.split("\n").map((l) => "+" + l).join("\n");
    } else if (change.update) {
      const move = change.update.move_path ? "  \u2192  " + change.update.move_path : "";
      head.textContent = visible("modified  " + path + move);
      body = change.update.unified_diff;
    }
    box.append(head);
    if (body) {
      const pre = el("pre", "diff");
      pre.append(diff(body));
      box.append(pre);
    }
    return box;
  }

  // A command as a shell would read it back: words quoted where they need it.
  function shellJoin(argv) {
    return argv.map((w) => (/^[\w@%+=:,./-]+$/.test(w) ? w : "'" + w.replace(/'/g, "'\\''") + "'")).join(" ");
  }

  return { el, visible, markdown, Ansi, diff, fileChange, shellJoin };
})();
