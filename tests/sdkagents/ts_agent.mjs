// A small ACP agent on the official TypeScript SDK (@agentclientprotocol/sdk 2.x, its stable v1
// entry point), written the way the SDK's 2.x API leads one to: a prompt handler that stops on
// its request's AbortSignal, which the SDK aborts on `$/cancel_request` — and no handler of
// `session/cancel`. No model, no network. Prompt markers (as tests/fakes/fake_acp.py's):
//
//   [[say:TEXT]]    answer TEXT in two agent_message_chunk updates (default: "ok: PROMPT")
//   [[tool:CMD]]    announce a tool call, run `sh -c CMD`, wait; on the abort, kill the tool's
//                   process (not its setsid children) and answer
//   [[silent]]      say nothing until aborted
//   [[fail:TEXT]]   throw Error(TEXT): the SDK answers -32603 "Internal error", the reason in data
//
// Every answer ends with " (earlier: N)", the prompts the session had before.
//
// Environment: ACP_SDK_DIR (the installed package's folder: required), SDK_AGENT_LOG (append
// each method received, one per line), SDK_AGENT_VERSION (the protocolVersion it answers),
// SDK_AGENT_CAPS ("resume,close": advertise and serve session/resume and session/close, stable
// in the 2026 schema), SDK_AGENT_STATE (a folder keeping each session's prompt count, so a
// fresh process can resume it; default: the cwd).
import { spawn } from "node:child_process";
import { appendFileSync, existsSync, readFileSync, writeFileSync } from "node:fs";
import { Readable, Writable } from "node:stream";
import { pathToFileURL } from "node:url";
import { randomUUID } from "node:crypto";

const acp = await import(pathToFileURL(`${process.env.ACP_SDK_DIR}/dist/v1/stable/acp.js`).href);
const { methods } = acp;

function record(method) {
  if (process.env.SDK_AGENT_LOG) appendFileSync(process.env.SDK_AGENT_LOG, `${method}\n`);
}

const caps = new Set((process.env.SDK_AGENT_CAPS ?? "").split(",").filter(Boolean));
const state = process.env.SDK_AGENT_STATE ?? process.cwd();
const sessions = new Map();
const stateFile = (id) => `${state}/${id.replace(/[^a-zA-Z0-9-]/g, "_")}.count`;
const save = (id, n) => writeFileSync(stateFile(id), String(n));

function aborted(signal) {
  return new Promise((resolve) => {
    if (signal.aborted) resolve();
    else signal.addEventListener("abort", () => resolve(), { once: true });
  });
}

function abortError() {
  const error = new Error("aborted");
  error.name = "AbortError";
  return error;
}

const app = acp.agent({ name: "corral-ts-sdk-agent" })
  .onRequest(methods.agent.initialize, async () => {
    record("initialize");
    return {
      protocolVersion: Number(process.env.SDK_AGENT_VERSION ?? acp.PROTOCOL_VERSION),
      agentCapabilities: {
        loadSession: false,
        sessionCapabilities: {
          ...(caps.has("resume") ? { resume: {} } : {}),
          ...(caps.has("close") ? { close: {} } : {}),
        },
      },
      agentInfo: { name: "corral-ts-sdk-agent", version: "1" },
      authMethods: [],
    };
  })
  .onRequest(methods.agent.session.new, async () => {
    record("session/new");
    const sessionId = `ts-${randomUUID()}`;
    sessions.set(sessionId, 0);
    save(sessionId, 0);
    return { sessionId };
  })
  .onRequest(methods.agent.session.resume, async ({ params }) => {
    record("session/resume");
    if (!caps.has("resume")) throw acp.RequestError.methodNotFound("session/resume");
    if (!existsSync(stateFile(params.sessionId))) throw acp.RequestError.sessionNotFound(params.sessionId);
    sessions.set(params.sessionId, Number(readFileSync(stateFile(params.sessionId), "utf8")));
    return {};
  })
  .onRequest(methods.agent.session.close, async ({ params }) => {
    record("session/close");
    if (!caps.has("close")) throw acp.RequestError.methodNotFound("session/close");
    sessions.delete(params.sessionId);
    return {};
  })
  .onRequest(methods.agent.session.prompt, async ({ params, signal, client }) => {
    record("session/prompt");
    const text = params.prompt.filter((b) => b.type === "text").map((b) => b.text).join("");
    const earlier = sessions.get(params.sessionId) ?? 0;
    sessions.set(params.sessionId, earlier + 1);
    save(params.sessionId, earlier + 1);
    const update = (u) => client.notify(methods.client.session.update, { sessionId: params.sessionId, update: u });
    const marker = (name) => {
      const m = text.match(new RegExp(`\\[\\[${name}(?::([\\s\\S]*?))?\\]\\]`));
      return m ? (m[1] ?? "") : null;
    };
    const fail = marker("fail");
    if (fail !== null) throw new Error(fail);
    const tool = marker("tool");
    if (tool !== null) {
      await update({ sessionUpdate: "tool_call", toolCallId: "t1", title: tool, kind: "execute", status: "in_progress", rawInput: { command: tool } });
      const child = spawn("sh", ["-c", tool], { stdio: "ignore" });
      const exited = new Promise((resolve) => child.on("exit", resolve));
      await Promise.race([exited, aborted(signal)]);
      if (signal.aborted) {
        child.kill("SIGKILL");
        throw abortError();
      }
      await update({ sessionUpdate: "tool_call_update", toolCallId: "t1", status: "completed", rawOutput: "done" });
    }
    if (marker("silent") !== null) {
      await aborted(signal);
      throw abortError();
    }
    const say = `${marker("say") ?? `ok: ${text}`} (earlier: ${earlier})`;
    const half = Math.ceil(say.length / 2);
    await update({ sessionUpdate: "agent_message_chunk", content: { type: "text", text: say.slice(0, half) } });
    await update({ sessionUpdate: "agent_message_chunk", content: { type: "text", text: say.slice(half) } });
    return { stopReason: "end_turn" };
  })
  // `$/cancel_request` is the protocol's own (the SDK aborts the request's signal); a
  // session/cancel arrives at this fallback, which only records it.
  .onNotification("*", async ({ method }) => { record(method); });

const stream = acp.ndJsonStream(Writable.toWeb(process.stdout), Readable.toWeb(process.stdin));
const connection = app.connect(stream);
await connection.closed;
