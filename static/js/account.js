// The account page's export: start it, poll its status, offer the file.
// Plain JavaScript on purpose: one button and one poll need no library.
(function () {
  "use strict";
  const section = document.getElementById("export");
  if (!section) return;
  const start = document.getElementById("export-start");
  const status = document.getElementById("export-status");
  const bar = document.getElementById("export-progress");
  const download = document.getElementById("export-download");
  const POLL_MS = 1000;
  let timer = null;

  function csrfToken() {
    const match = document.cookie.match(/(?:^|; )csrftoken=([^;]*)/);
    return match ? decodeURIComponent(match[1]) : "";
  }

  function url(template, taskId) {
    return template.replace("TASK", encodeURIComponent(taskId));
  }

  function show(data) {
    const progress = data.progress;
    if (progress && progress.total) {
      bar.hidden = false;
      bar.max = progress.total;
      bar.value = progress.done;
    }
    if (data.status === "SUCCESSFUL") {
      bar.hidden = true;
      status.textContent = "Your export is ready.";
      download.href = url(section.dataset.downloadUrl, data.id);
      download.hidden = false;
      start.disabled = false;
      return true;
    }
    if (data.status === "FAILED") {
      bar.hidden = true;
      status.textContent = "The export failed. Please try again later.";
      start.disabled = false;
      return true;
    }
    const note = progress && progress.note ? " (" + progress.note + ")" : "";
    status.textContent = (data.status === "RUNNING" ? "Preparing your export" : "Waiting for a worker") + note + "...";
    return false;
  }

  function poll(taskId) {
    // A hidden tab does not poll; it catches up when shown again.
    if (document.hidden) {
      timer = setTimeout(function () { poll(taskId); }, POLL_MS);
      return;
    }
    fetch(url(section.dataset.statusUrl, taskId), { credentials: "same-origin" })
      .then(function (response) { return response.json(); })
      .then(function (body) {
        if (body.data && show(body.data)) return;
        timer = setTimeout(function () { poll(taskId); }, POLL_MS);
      })
      .catch(function () {
        status.textContent = "Cannot reach the server; trying again...";
        timer = setTimeout(function () { poll(taskId); }, POLL_MS * 3);
      });
  }

  start.addEventListener("click", function () {
    start.disabled = true;
    download.hidden = true;
    status.textContent = "Asking for your export...";
    fetch(section.dataset.exportUrl, {
      method: "POST",
      credentials: "same-origin",
      headers: { "X-CSRFToken": csrfToken() },
    })
      .then(function (response) { return response.json().then(function (body) { return [response, body]; }); })
      .then(function (pair) {
        const response = pair[0], body = pair[1];
        if (response.status !== 202) {
          const errors = body.errors ? Object.values(body.errors).flat().join(" ") : "";
          status.textContent = "Could not start the export. " + errors;
          start.disabled = false;
          return;
        }
        clearTimeout(timer);
        poll(body.data.id);
      })
      .catch(function () {
        status.textContent = "Cannot reach the server. Please try again.";
        start.disabled = false;
      });
  });

  if (section.dataset.taskId) poll(section.dataset.taskId);
})();
