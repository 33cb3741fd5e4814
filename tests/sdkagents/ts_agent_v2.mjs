// A small ACP agent on the official TypeScript SDK's draft ACP v2 entry point (as the SDK's
// README shows it: `@agentclientprotocol/sdk/experimental/v2`): it answers `initialize` with
// protocol version 2, whatever the client asked for. No model, no network.
// Environment: ACP_SDK_DIR (the installed package's folder: required), SDK_AGENT_LOG (append
// each method received, one per line).
import { appendFileSync } from "node:fs";
import { Readable, Writable } from "node:stream";
import { pathToFileURL } from "node:url";

const v2 = await import(pathToFileURL(`${process.env.ACP_SDK_DIR}/dist/v2/stable/acp.js`).href);

function record(method) {
  if (process.env.SDK_AGENT_LOG) appendFileSync(process.env.SDK_AGENT_LOG, `${method}\n`);
}

const app = v2.agent({ name: "corral-ts-sdk-v2-agent" })
  .onRequest(v2.methods.agent.initialize, () => {
    record("initialize");
    return { protocolVersion: v2.PROTOCOL_VERSION, info: { name: "corral-ts-sdk-v2-agent", version: "1" },
             capabilities: { session: {} } };
  })
  .onRequest(v2.methods.agent.session.new, () => {
    record("session/new");
    return { sessionId: "v2-session" };
  });

const connection = app.connect(v2.ndJsonStream(Writable.toWeb(process.stdout), Readable.toWeb(process.stdin)));
await connection.closed;
