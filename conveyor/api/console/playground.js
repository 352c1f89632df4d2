// The playground: a chat message or a raw prompt with the main sampling parameters, streamed token by
// token from the OpenAI routes, with TTFT and tokens/s, and the same request as a curl line. With
// several models (GET /v1/models), a picker names the request's `model`.
import { h, request as call, sse } from "./api.js";

function number(input) {
  const v = input.value.trim();
  return v === "" ? undefined : Number(v);
}

function field(label, input) {
  return h("label", { class: "field" }, h("span", {}, label), input);
}

export function curlLine(path, body) {
  const json = JSON.stringify(body).replace(/'/g, "'\\''");
  return `curl -N ${location.origin}${path} -H "Authorization: Bearer $CONVEYOR_API_KEY" ` +
    `-H 'Content-Type: application/json' -d '${json}'`;
}

export async function playground(main, { signal }) {
  const models = (await call("GET", "/v1/models")).data.map((m) => m.id);
  if (signal.aborted) return;
  const model = h("select", { "data-testid": "model" }, models.map((id) => h("option", { value: id }, id)));
  const mode = h("select", { "data-testid": "mode" }, h("option", { value: "chat" }, "chat"),
    h("option", { value: "raw" }, "raw prompt"));
  const system = h("input", { type: "text", placeholder: "(the model's default)", "data-testid": "system" });
  const prompt = h("textarea", { rows: 4, "data-testid": "prompt" }, "Write a haiku about queues.");
  const maxTokens = h("input", { type: "number", value: "64", min: "1", "data-testid": "max-tokens" });
  const temperature = h("input", { type: "number", value: "0.7", step: "0.1", min: "0", "data-testid": "temperature" });
  const topP = h("input", { type: "number", value: "1", step: "0.05", min: "0", max: "1" });
  const topK = h("input", { type: "number", value: "", min: "0", placeholder: "off" });
  const seed = h("input", { type: "number", value: "", placeholder: "random", "data-testid": "seed" });
  const stop = h("input", { type: "text", value: "", placeholder: "comma-separated" });
  const ignoreEos = h("input", { type: "checkbox", "data-testid": "ignore-eos" });
  const send = h("button", { type: "submit", class: "primary", "data-testid": "send" }, "Send");
  const halt = h("button", { type: "button", disabled: true }, "Stop");
  const output = h("pre", { class: "tokens", "data-testid": "output" });
  const stats = h("div", { class: "stats" });
  const curl = h("pre", { class: "curl", "data-testid": "curl" });
  const copy = h("button", { type: "button" }, "Copy");
  const form = h("form", { class: "playground" },
    h("div", { class: "row" }, models.length > 1 ? field("Model", model) : null, field("Mode", mode),
      field("System prompt (chat)", system)),
    field("Prompt", prompt),
    h("div", { class: "row" }, field("max_tokens", maxTokens), field("temperature", temperature),
      field("top_p", topP), field("top_k", topK), field("seed", seed), field("stop", stop),
      h("label", { class: "field check" }, h("span", {}, "ignore_eos"), ignoreEos)),
    h("div", { class: "toolbar" }, send, halt));
  main.replaceChildren(h("h1", {}, "Playground"), form, stats, output,
    h("h2", {}, "The same request"), h("div", { class: "toolbar" }, copy), curl);

  function request() {
    const params = { max_tokens: number(maxTokens), temperature: number(temperature), top_p: number(topP),
      top_k: number(topK), seed: number(seed), stream: true, stream_options: { include_usage: true } };
    const stops = stop.value.split(",").map((s) => s.trim()).filter(Boolean);
    if (stops.length) params.stop = stops;
    if (ignoreEos.checked) params.ignore_eos = true;
    for (const k of Object.keys(params)) if (params[k] === undefined) delete params[k];
    const name = models.length > 1 ? model.value : "conveyor"; // one model: `model` is not looked at
    if (mode.value === "chat") {
      const messages = system.value.trim() ? [{ role: "system", content: system.value }] : [];
      messages.push({ role: "user", content: prompt.value });
      return { path: "/v1/chat/completions", body: { model: name, messages, ...params } };
    }
    return { path: "/v1/completions", body: { model: name, prompt: prompt.value, ...params } };
  }
  function showCurl() { const r = request(); curl.textContent = curlLine(r.path, r.body); }
  form.addEventListener("input", showCurl);
  model.addEventListener("change", showCurl);
  showCurl();
  copy.addEventListener("click", async () => {
    try { await navigator.clipboard.writeText(curl.textContent); copy.textContent = "Copied"; }
    catch { window.getSelection().selectAllChildren(curl); copy.textContent = "Selected: press Ctrl+C"; }
  });

  let controller = null;
  signal.addEventListener("abort", () => controller && controller.abort());
  halt.addEventListener("click", () => controller && controller.abort());
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const { path, body } = request();
    controller = new AbortController();
    send.disabled = true; halt.disabled = false;
    output.textContent = ""; output.classList.remove("error");
    const started = performance.now();
    let first = null; let last = null; let chunks = 0; let usage = null; let finish = null;
    const show = (state) => {
      const n = usage ? usage.completion_tokens : chunks;
      const rate = first !== null && last > first && n > 1 ? ((n - 1) * 1000) / (last - first) : null;
      stats.replaceChildren(
        h("span", {}, "TTFT ", h("b", { "data-testid": "ttft" }, first === null ? "—" : `${Math.round(first - started)} ms`)),
        h("span", {}, "tokens ", h("b", { "data-testid": "tokens-count" }, n)),
        h("span", {}, "tokens/s ", h("b", { "data-testid": "tokens-per-s" }, rate === null ? "—" : rate.toFixed(1))),
        h("span", {}, "finish ", h("b", { "data-testid": "finish" }, finish || "—")),
        h("span", { class: "muted", "data-testid": "state" }, state));
    };
    show("waiting");
    try {
      for await (const event of sse(path, { method: "POST", body, signal: controller.signal })) {
        if (event.data === "[DONE]") break;
        const data = JSON.parse(event.data);
        if (data.error) throw new Error(data.error.message);
        if (data.usage) usage = data.usage;
        const choice = data.choices && data.choices[0];
        if (!choice) { show("streaming"); continue; }
        const text = choice.delta ? choice.delta.content : choice.text;
        if (choice.finish_reason) finish = choice.finish_reason;
        if (text) {
          const now = performance.now();
          if (first === null) first = now;
          last = now; chunks += 1;
          output.append(text);
        }
        show("streaming");
      }
      show("done");
    } catch (error) {
      if (controller.signal.aborted) show("stopped (the job was cancelled)");
      else { output.classList.add("error"); output.append(`\n${error.message}`); show("failed"); }
    } finally {
      send.disabled = false; halt.disabled = true;
    }
  });
}
