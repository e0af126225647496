// Drive a running code-server (VS Code in a browser) with headless Chromium through playwright-core:
// open add.py, type one key and wait for the inline ghost text, accept it with Tab; then run "dfim: Fill the
// Hole at the Cursor" on its `pass`, then "dfim: Show Denoising Canvas of the Last Fill", and check the
// webview shows the page with its script running under the webview policy.
//
//   node webview-check.js URL [SCREENSHOT.png]
//
// install-check.sh --webview starts code-server and runs this (playwright-core resolved through NODE_PATH).

const { chromium } = require("playwright-core");

const [url, screenshot] = process.argv.slice(2);
const CHROMIUM = process.env.CHROMIUM || "/usr/bin/chromium";

function fail(message) {
  console.error(`webview-check: ${message}`);
  process.exitCode = 1;
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

    // Inline ghost text from the first keystroke in the new window: a space after `    return` on line 13,
    // then no other key. The model may still be loading: the server holds the request, or the extension
    // asks again when the status turns ready. Tab accepts it into the line.
    await editor.click();
    await page.keyboard.press("Control+g");
    await page.locator(".quick-input-widget input").waitFor();
    await page.keyboard.type("13:11");
    await page.keyboard.press("Enter");
    const loadingAtKeystroke = (await status.locator(".codicon-sync").count()) > 0; // the loading spinner
    await page.keyboard.type(" ");
    const ghost = page.locator(".monaco-editor .ghost-text-decoration, .monaco-editor .ghost-text").first();
    await ghost.waitFor({ timeout: 90_000 });
    const ghostText = (await ghost.innerText()).replace(/\u00a0/g, " ");
    await page.keyboard.press("Tab");
    await page.waitForTimeout(500);
    const lines = (await page.locator(".monaco-editor .view-lines .view-line").allInnerTexts()).map((t) =>
      t.replace(/\u00a0/g, " "),
    );
    const accepted = lines.find((t) => t.trimStart().startsWith("return ")) ?? "";
    console.log(JSON.stringify({ loadingAtKeystroke, ghostText, accepted }));
    if (!ghostText.trim()) fail("the ghost text is empty");
    if (!accepted.includes(ghostText.trim().slice(0, 12))) fail(`Tab did not insert the ghost text: ${accepted}`);

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
