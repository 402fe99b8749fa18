// Headless screenshot of a TensorBoard dashboard (how docs/tensorboard/*.png were taken).
//
// chromium's --screenshot cannot untick "Ignore outliers in chart scaling", which TensorBoard
// keeps in localStorage; this drives Debian's chromium over the DevTools protocol instead:
//   chromium --headless --no-sandbox --disable-gpu --remote-debugging-port=9337 \
//     --user-data-dir=/tmp/profile about:blank &
//   node --experimental-websocket docs/tensorboard/screenshot.mjs 9337 http://127.0.0.1:6006 \
//     1120 2450 custom_scalars.png "#custom_scalars&_smoothingWeight=0.8" \
//     '{"_ignoreYOutliers":"false"}' 1.25
// Arguments: DevTools port, TensorBoard origin, CSS width and height, output PNG, URL fragment,
// localStorage entries (JSON), device scale factor. Node >= 20.10 (built-in WebSocket).
import { writeFileSync } from "node:fs";
const [port, origin, width, height, out, fragment, storage = "{}", scale = "1"] = process.argv.slice(2);
const pages = await (await fetch(`http://127.0.0.1:${port}/json/list`)).json();
const page = pages.find((p) => p.type === "page");
const ws = new WebSocket(page.webSocketDebuggerUrl);
await new Promise((r) => ws.addEventListener("open", r));
let id = 0;
const pending = new Map();
const waiters = [];
ws.addEventListener("message", (ev) => {
  const msg = JSON.parse(ev.data);
  if (msg.id && pending.has(msg.id)) { pending.get(msg.id)(msg); pending.delete(msg.id); }
  else if (msg.method) for (const w of waiters.splice(0)) w(msg);
});
const send = (method, params = {}) => new Promise((r) => { const i = ++id; pending.set(i, r); ws.send(JSON.stringify({ id: i, method, params })); });
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
await send("Page.enable");
await send("Emulation.setDeviceMetricsOverride", { width: +width, height: +height, deviceScaleFactor: +scale, mobile: false });
await send("Page.navigate", { url: origin + "/" });
await sleep(4000);
for (const [k, v] of Object.entries(JSON.parse(storage))) {
  await send("Runtime.evaluate", { expression: `localStorage.setItem(${JSON.stringify(k)}, ${JSON.stringify(v)})` });
}
await send("Page.navigate", { url: "about:blank" });
await sleep(500);
await send("Page.navigate", { url: origin + "/" + fragment });
await sleep(12000);
const shot = await send("Page.captureScreenshot", { format: "png" });
writeFileSync(out, Buffer.from(shot.result.data, "base64"));
console.log("wrote", out);
ws.close();
