// llmem ui: the only script (the CSP allows no inline one). Pages work without it; it adds
// live refresh and submit-on-change, both declared in the markup with data- attributes.
"use strict";

// <section id="x" data-live="5">: every 5 s, fetch this page again and swap in the new #x.
function liveRefresh(element) {
  const seconds = Number(element.dataset.live) || 5;
  setInterval(async () => {
    if (document.hidden) return;
    try {
      const reply = await fetch(window.location.href, { credentials: "same-origin" });
      if (!reply.ok) return;
      const page = new DOMParser().parseFromString(await reply.text(), "text/html");
      const fresh = page.getElementById(element.id);
      if (fresh && fresh.innerHTML !== element.innerHTML) {
        element.replaceChildren(...fresh.childNodes);
      }
    } catch (_) { /* the server stopped: the page stays as it is */ }
  }, seconds * 1000);
}

// <select data-submit-on-change>: a filter applies as soon as it is picked.
function submitOnChange(control) {
  control.addEventListener("change", () => control.form && control.form.requestSubmit());
}

// <pre id="log" data-sse="/queue/logs/stream">: a live tail over server-sent events. Each
// (re)connection starts with the latest entries, so the server-rendered ones are replaced on
// open; an entry is added as text, never as markup, and the oldest go past data-keep lines.
function liveTail(element) {
  const keep = Number(element.dataset.keep) || 1000;
  const source = new EventSource(element.dataset.sse);
  source.addEventListener("open", () => element.replaceChildren());
  source.addEventListener("entry", (message) => {
    const entry = JSON.parse(message.data);
    const following = element.scrollTop + element.clientHeight >= element.scrollHeight - 8;
    const line = document.createElement("span");
    line.className = "log-" + (entry.level || "none");
    line.textContent = entry.text + "\n";
    element.append(line);
    while (element.childElementCount > keep) element.firstElementChild.remove();
    if (following) element.scrollTop = element.scrollHeight;
  });
}

document.addEventListener("DOMContentLoaded", () => {
  document.querySelectorAll("[data-live][id]").forEach(liveRefresh);
  document.querySelectorAll("[data-submit-on-change]").forEach(submitOnChange);
  document.querySelectorAll("[data-sse]").forEach(liveTail);
});
