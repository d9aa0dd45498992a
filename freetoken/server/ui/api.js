// HTTP helpers of the status page: the optional API key (kept in sessionStorage) on every call.
"use strict";

function authHeaders() {
  const key = document.getElementById("api-key").value.trim();
  return key ? { Authorization: "Bearer " + key } : {};
}

// JSON of a GET or POST; throws Error(server message) on a non-2xx answer.
async function callJson(path, body) {
  const init = { headers: authHeaders() };
  if (body !== undefined) {
    init.method = "POST";
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const r = await fetch(path, init);
  const data = await r.json().catch(() => null);
  if (!r.ok) {
    const msg = data && data.error && data.error.message ? data.error.message : "HTTP " + r.status;
    const err = new Error(msg);
    err.code = data && data.error ? data.error.code : null;  // "model_loading" while it loads
    throw err;
  }
  return data;
}
