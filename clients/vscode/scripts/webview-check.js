// Drive a running code-server (VS Code in a browser) with headless Chromium through playwright-core, on
// add.py with the real `dfim serve`:
// 1. one key in the new window shows inline ghost text (the model may still be loading);
// 2. Alt+] (next inline suggestion) shows other candidates, until it comes round to the first; Alt+[ steps
//    back, Alt+] forward again;
// 3. Tab accepts the first into the line;
// 4. with no other key, the next suggestion shows at the new cursor (Tab-Tab: VS Code asks again after an
//    accept), answered from the server's speculation (telemetry source `speculation`, checked when
//    TELEMETRY_DIR names the server's telemetry folder);
// 5. "dfim: Fill the Hole at the Cursor" on a `pass`, then "dfim: Show Denoising Canvas of the Last Fill":
//    the webview must show the page with its script running under the webview policy.
// Each step from 2 on prints what it saw as JSON; a check that does not hold sets exit status 1.
//
//   node webview-check.js URL [SCREENSHOT.png]
//
// install-check.sh --webview starts code-server and runs this (playwright-core resolved through NODE_PATH).

const { readFileSync } = require("node:fs");
const { join } = require("node:path");
const { chromium } = require("playwright-core");

const [url, screenshot] = process.argv.slice(2);
const CHROMIUM = process.env.CHROMIUM || "/usr/bin/chromium";
const TELEMETRY_DIR = process.env.TELEMETRY_DIR;
const GHOST = ".monaco-editor .ghost-text-decoration, .monaco-editor .ghost-text";

function fail(message) {
  console.error(`webview-check: ${message}`);
  process.exitCode = 1;
}

/** The `source` of every suggestion the server recorded as shown, in order; null without TELEMETRY_DIR. */
function shownSources() {
  if (!TELEMETRY_DIR) return null;
  let text = "";
  try {
    text = readFileSync(join(TELEMETRY_DIR, "telemetry.jsonl"), "utf8");
  } catch {
    return [];
  }
  const events = text.split("\n").filter(Boolean).map((line) => JSON.parse(line));
  return events.filter((e) => e.event === "shown").map((e) => e.source);
}

/** The ghost text on screen: VS Code splits a long one into several spans (and puts lines after the first in
 * a zone of their own); no-break spaces as spaces. "" when none shows. */
async function ghostText(page) {
  const text = await page.evaluate(() => {
    const inline = [...document.querySelectorAll(".monaco-editor .ghost-text-decoration")].map((el) => el.textContent);
    const below = [...document.querySelectorAll(".monaco-editor .ghost-text")].map((el) => `\n${el.textContent}`);
    return inline.join("") + below.join("");
  });
  return text.replace(/\u00a0/g, " ");
}

/** Line `n` as the document has it: the line on screen (found by its line number) without ghost text. */
async function lineText(page, n) {
  return page.evaluate((n) => {
    const number = [...document.querySelectorAll(".monaco-editor .line-numbers")].find(
      (el) => el.textContent.trim() === String(n),
    );
    const top = number?.parentElement?.style.top;
    const lines = document.querySelectorAll(".monaco-editor .view-lines .view-line");
    const line = [...lines].find((el) => el.style.top === top);
    if (!top || !line) return null;
    const copy = line.cloneNode(true);
    for (const ghost of copy.querySelectorAll("[class*='ghost-text']")) ghost.remove();
    return copy.textContent.replace(/\u00a0/g, " ");
  }, n);
}

/** Poll `probe` every 250 ms until it returns something truthy, at most `ms`; its last value. */
async function poll(page, ms, probe) {
  let value;
  for (const end = Date.now() + ms; !(value = await probe()) && Date.now() < end; ) await page.waitForTimeout(250);
  return value;
}

async function main() {
  const browser = await chromium.launch({
    executablePath: CHROMIUM,
    args: ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
  const page = await browser.newPage({ viewport: { width: 1400, height: 900 } });
  const refused = [];
  page.on("console", (m) => {
    if (/content security policy/i.test(m.text())) refused.push(m.text());
  });
  try {
    await page.goto(url);
    await page.waitForSelector(".monaco-workbench", { timeout: 90_000 });
    const status = page.locator(".statusbar-item", { hasText: "dfim" }).first();
    await status.waitFor({ timeout: 60_000 });

    await page.keyboard.press("Control+p");
    await page.locator(".quick-input-widget input").waitFor();
    await page.keyboard.type("add.py");
    await page.locator(".quick-input-list .monaco-list-row", { hasText: "add.py" }).first().waitFor();
    await page.keyboard.press("Enter");
    const editor = page.locator(".monaco-editor .view-lines").first();
    await editor.waitFor({ timeout: 30_000 });

    // 1. Inline ghost text from the first keystroke in the new window: a space after `    return` on line 13,
    // then no other key. The model may still be loading: the server holds the request, or the extension
    // asks again when the status turns ready.
    await editor.click();
    await page.keyboard.press("Control+g");
    await page.locator(".quick-input-widget input").waitFor();
    await page.keyboard.type("13:11");
    await page.keyboard.press("Enter");
    const loadingAtKeystroke = (await status.locator(".codicon-sync").count()) > 0; // the loading spinner
    await page.keyboard.type(" ");
    await page.locator(GHOST).first().waitFor({ timeout: 90_000 });
    const firstGhost = await ghostText(page);

    // 2. Cycling: Alt+] (next inline suggestion) asks the server for alternatives (triggerKind Invoked, which
    // it answers with several distinct candidates) and shows the next one; pressed again it steps on until
    // it comes round to the first. Alt+[ steps back; Alt+] then returns to the first, which Tab accepts.
    /** Press `key` and wait for the ghost text to change; the new text, or "" if it did not. */
    async function step(key, from) {
      await page.keyboard.press(key);
      return poll(page, 30_000, async () => {
        const text = await ghostText(page);
        return text && text !== from ? text : "";
      });
    }
    const cycle = [firstGhost];
    let current = firstGhost;
    for (let i = 0; i < 8 && current; i++) {
      current = await step("Alt+BracketRight", current);
      if (!current || current === firstGhost) break; // round to the first
      cycle.push(current);
    }
    const back = cycle.length > 1 && current === firstGhost ? await step("Alt+BracketLeft", current) : "";
    if (back) current = await step("Alt+BracketRight", back);
    const cycling = { cycle, back, current, line: await lineText(page, 13) };
    console.log(JSON.stringify({ cycling }));
    if (cycle.length < 2) fail("Alt+] showed no other suggestion");
    else if (current !== firstGhost) fail("Alt+] did not come round to the first suggestion");
    else if (back !== cycle.at(-1)) fail(`Alt+[ on the first suggestion did not show the last one: ${back}`);
    if (cycling.line !== "    return ") fail(`cycling changed the line: ${cycling.line}`);

    // 3. Tab accepts the suggestion on screen into the line.
    await page.keyboard.press("Tab");
    await page.waitForTimeout(500);
    const accepted = (await lineText(page, 13)) ?? "";
    console.log(JSON.stringify({ loadingAtKeystroke, ghostText: firstGhost, accepted }));
    if (!firstGhost.trim()) fail("the ghost text is empty");
    if (accepted !== `    return ${firstGhost.split("\n")[0]}`) fail(`Tab did not insert the ghost text: ${accepted}`);

    // 4. Tab-Tab: no other key, and the next suggestion shows after the accepted text, where the cursor now
    // is. The server filled it while the first one was shown: its answer is the speculation's.
    const next = await poll(page, 30_000, async () => ((await lineText(page, 13)) === accepted ? ghostText(page) : ""));
    const tabTab = {
      cursor: await page.locator('[id="status.editor.selection"]').innerText(),
      nextGhostText: next ?? "",
      source: shownSources()?.at(-1),
    };
    console.log(JSON.stringify({ tabTab }));
    if (!next?.trim()) fail("no next suggestion after the accept");
    if (tabTab.cursor !== `Ln 13, Col ${accepted.length + 1}`) fail(`the cursor is not after the accept: ${tabTab.cursor}`);
    if (TELEMETRY_DIR && tabTab.source !== "speculation") {
      fail(`the next suggestion came from ${tabTab.source}, not the speculation`);
    }
    await page.keyboard.press("Escape");

    // 5. A fill, and its canvas in a webview.
    async function command(name) {
      await page.keyboard.press("F1");
      await page.locator(".quick-input-widget input").waitFor();
      await page.keyboard.type(name);
      await page.locator(".quick-input-list .monaco-list-row", { hasText: name.replace(/^dfim: /, "") }).first().waitFor();
      await page.keyboard.press("Enter");
    }

    // The model loads in the background: ask again until a fill has run (the status shows its steps).
    let filled = false;
    for (let attempt = 0; attempt < 12 && !filled; attempt++) {
      await editor.click();
      await page.keyboard.press("Control+g");
      await page.locator(".quick-input-widget input").waitFor();
      await page.keyboard.type("2:6"); // on `pass`
      await page.keyboard.press("Enter");
      await command("dfim: Fill the Hole at the Cursor");
      for (let i = 0; i < 20 && !filled; i++) {
        await page.waitForTimeout(500);
        filled = /steps/.test(await status.innerText());
      }
    }
    if (!filled) throw new Error(`no fill ran; status: ${await status.innerText()}`);

    await command("dfim: Show Denoising Canvas of the Last Fill");
    let frame = null;
    for (let i = 0; i < 60 && !frame; i++) {
      await page.waitForTimeout(500);
      for (const f of page.frames()) {
        if (await f.locator("#final").count().catch(() => 0)) {
          frame = f;
          break;
        }
      }
    }
    if (!frame) throw new Error("no webview with the canvas page");
    await frame.locator("#label").filter({ hasText: "step" }).waitFor({ timeout: 10_000 });
    const result = {
      tab: (await page.locator(".tab", { hasText: "dfim canvas" }).allInnerTexts()).map((t) => t.trim()),
      label: await frame.locator("#label").innerText(),
      final: await frame.locator("#final").innerText(),
      frameText: await frame.locator("#frame-text").innerText(),
      canvasTokens: await frame.locator("#canvas span.tok").count(),
      policyRefusals: refused,
    };
    console.log(JSON.stringify(result, null, 1));
    if (!result.tab.some((t) => /^dfim canvas: \d+ steps, \d+ ms/.test(t))) fail("no 'dfim canvas' tab");
    if (result.frameText !== result.final) fail("the last frame (written by the page's script) is not the fill");
    if (result.canvasTokens < 1) fail("the canvas has no tokens");
    if (refused.length) fail("the Content-Security-Policy refused something");
  } finally {
    if (screenshot) await page.screenshot({ path: screenshot }).catch(() => undefined);
    await browser.close();
  }
}

main().then(
  () => {
    if (!process.exitCode) console.log("webview-check: ok");
  },
  (err) => fail(err instanceof Error ? err.message : String(err)),
);
