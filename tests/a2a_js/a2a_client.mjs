// Drives one chain of a construct-mcp server to its end with the A2A JavaScript SDK's own client
// (@a2a-js/sdk, pinned in package.json beside this file), as a JS agent would, and prints what it
// saw as one JSON object on stdout.
//
//   node a2a_client.mjs BASE_URL [--protocol 1.0|0.3] [--chain JSON]
//
// The client comes from the SDK's ClientFactory, built from the agent card at
// BASE_URL/.well-known/agent-card.json. It starts a run of the chain "default" with a gate before
// "engineer" over SendStreamingMessage, answers every input-required (a host task with the text
// "[js output] <task_id>" and metadata.task_id; a gate with metadata.gate_id and decision
// "approve"), alternating blocking SendMessage and the stream, until the task ends; then GetTask
// and ListTasks. A2A_TOKEN in the environment, when set, is sent as a bearer token by a call
// interceptor (the SDK's way to add headers). Every JSON-RPC request is recorded as it leaves
// (method, A2A-Version header, whether it carried a token) through the transport's fetch.
// `--protocol 0.3` takes the SDK's v0.3 compatibility transport instead (the card's interface read
// as 0.3), to drive the server's 0.3 method names. `--chain '["writer"]'` starts that chain (a
// name or a list of specialists, as JSON) with no gate instead, and sends its request "Write it.".
//
// Exit status: 0 when the task completed, 1 when anything failed (the error on stderr, and in the
// summary's "error" when the summary could still be printed).

import { readFile } from "node:fs/promises";
import { randomUUID } from "node:crypto";
import {
  ClientFactory,
  ClientFactoryOptions,
  JsonRpcTransportFactory,
} from "@a2a-js/sdk/client";
import { Role, TaskState } from "@a2a-js/sdk";

const MAX_REPLIES = 20;

function parseArgs(argv) {
  const args = { base: undefined, protocol: "1.0", chain: undefined };
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === "--protocol") args.protocol = argv[++i];
    else if (argv[i] === "--chain") args.chain = JSON.parse(argv[++i]);
    else if (args.base === undefined) args.base = argv[i];
    else throw new Error(`unexpected argument ${argv[i]}`);
  }
  if (!args.base) throw new Error("usage: node a2a_client.mjs BASE_URL [--protocol 1.0|0.3]");
  if (!["1.0", "0.3"].includes(args.protocol)) throw new Error(`unknown protocol ${args.protocol}`);
  return args;
}

async function sdkVersion() {
  const url = new URL("./node_modules/@a2a-js/sdk/package.json", import.meta.url);
  return JSON.parse(await readFile(url, "utf-8")).version;
}

/** A fetch that records each JSON-RPC request it sends (never the token itself). */
function recordingFetch(wire) {
  return async (url, init) => {
    const headers = new Headers(init?.headers);
    let method;
    try {
      method = JSON.parse(init?.body ?? "{}").method;
    } catch {
      method = undefined;
    }
    wire.push({
      method,
      a2a_version: headers.get("A2A-Version"),
      accept: headers.get("Accept"),
      bearer: (headers.get("Authorization") ?? "").startsWith("Bearer "),
    });
    return fetch(url, init);
  };
}

/** The SDK's way to add a header to every call: an interceptor setting a service parameter. */
function bearer(token) {
  return {
    async before(args) {
      args.options = args.options ?? {};
      args.options.serviceParameters = {
        ...args.options.serviceParameters,
        Authorization: `Bearer ${token}`,
      };
    },
    async after() {},
  };
}

const stateName = (state) => TaskState[state] ?? String(state);

function textPart(text) {
  return { content: { $case: "text", value: text }, metadata: undefined, filename: "", mediaType: "" };
}

function message(text, { taskId = "", contextId = "", metadata = undefined } = {}) {
  return {
    messageId: `js-${randomUUID()}`,
    contextId,
    taskId,
    role: Role.ROLE_USER,
    parts: [textPart(text)],
    metadata,
    extensions: [],
    referenceTaskIds: [],
  };
}

/** The questions of an input-required status: its data part's "questions". */
function questionsOf(status) {
  for (const part of status?.message?.parts ?? []) {
    if (part.content?.$case === "data" && Array.isArray(part.content.value?.questions)) {
      return part.content.value.questions;
    }
  }
  throw new Error(`input-required without questions: ${JSON.stringify(status)}`);
}

/** Send `sent` blocking (SendMessage); the task as it answers. */
async function sendBlocking(client, sent, counts) {
  const answer = await client.sendMessage({ tenant: "", message: sent, configuration: undefined, metadata: undefined });
  counts.send += 1;
  if (!("status" in answer)) throw new Error(`SendMessage answered a message, not a task: ${JSON.stringify(answer)}`);
  return { id: answer.id, contextId: answer.contextId, status: answer.status, artifacts: answer.artifacts };
}

/** Send `sent` over SendStreamingMessage; the task as the stream's events leave it. */
async function sendStreaming(client, sent, counts) {
  let task;
  const artifacts = new Map();
  for await (const event of client.sendMessageStream({
    tenant: "",
    message: sent,
    configuration: undefined,
    metadata: undefined,
  })) {
    const kind = event.payload?.$case ?? "none";
    counts.events[kind] = (counts.events[kind] ?? 0) + 1;
    const value = event.payload?.value;
    if (kind === "artifactUpdate" && !value.lastChunk) {
      // a piece of an output as it is written: appended to the pieces before, unless it starts anew
      const id = value.artifact.artifactId;
      const text = value.artifact.parts.map((p) => (p.content?.$case === "text" ? p.content.value : "")).join("");
      counts.pieces = (counts.pieces ?? 0) + 1;
      counts.streamed = counts.streamed ?? {};
      counts.streamed[id] = (value.append ? (counts.streamed[id] ?? "") : "") + text;
    }
    if (kind === "task") {
      task = { id: value.id, contextId: value.contextId, status: value.status, artifacts: value.artifacts };
      for (const artifact of value.artifacts) artifacts.set(artifact.artifactId, artifact);
    } else if (kind === "statusUpdate") {
      if (!task || value.taskId !== task.id) throw new Error(`a status update of another task: ${value.taskId}`);
      task.status = value.status;
    } else if (kind === "artifactUpdate") {
      if (value.lastChunk) artifacts.set(value.artifact.artifactId, value.artifact);
    } else {
      throw new Error(`unexpected stream event ${kind}`);
    }
  }
  counts.stream += 1;
  if (!task) throw new Error("the stream carried no task");
  task.artifacts = [...artifacts.values()];
  return task;
}

function artifactTexts(artifacts) {
  const texts = {};
  for (const artifact of artifacts ?? []) {
    texts[artifact.artifactId] = artifact.parts
      .filter((p) => p.content?.$case === "text")
      .map((p) => p.content.value)
      .join("");
  }
  return texts;
}

async function drive(args, summary) {
  const wire = summary.wire;
  const fetchImpl = recordingFetch(wire);
  const token = process.env.A2A_TOKEN;
  const options = ClientFactoryOptions.createFrom(ClientFactoryOptions.default, {
    transports: [
      new JsonRpcTransportFactory({ fetchImpl, legacyCompat: { enabled: args.protocol === "0.3" } }),
    ],
    clientConfig: { interceptors: token ? [bearer(token)] : [], polling: false },
    preferredTransports: ["JSONRPC"],
  });
  const factory = new ClientFactory(options);
  let client, card;
  if (args.protocol === "1.0") {
    client = await factory.createFromUrl(args.base);
    card = await client.getAgentCard();
  } else {
    // the card as served, then a copy whose interface says 0.3 (what a 0.3 agent's card says)
    card = await (await fetch(new URL("/.well-known/agent-card.json", args.base))).json();
    const old = structuredClone(card);
    for (const iface of old.supportedInterfaces) iface.protocolVersion = "0.3";
    client = await factory.createFromAgentCard(old);
  }
  summary.card = {
    name: card.name,
    interfaces: card.supportedInterfaces.map((i) => ({
      url: i.url,
      binding: i.protocolBinding,
      version: i.protocolVersion,
    })),
    streaming: card.capabilities?.streaming ?? false,
    push_notifications: card.capabilities?.pushNotifications ?? false,
    skills: card.skills.map((s) => s.id),
  };
  summary.client_protocol_version = client.protocolVersion;
  summary.transport = client.transport.constructor.name;

  const counts = { send: 0, stream: 0, events: {} };
  summary.counts = counts;
  const contextId = `js-ctx-${randomUUID()}`;
  summary.context_id_sent = contextId;
  const metadata =
    args.chain === undefined ? { chain: "default", approve_before: ["engineer"] } : { chain: args.chain };
  const first = message(args.chain === undefined ? "Add a health endpoint." : "Write it.", {
    contextId,
    metadata,
  });
  // The first step over the stream when the card offers it (the SDK falls back to SendMessage
  // by itself otherwise).
  let task = await sendStreaming(client, first, counts);
  summary.task_id = task.id;
  summary.context_id = task.contextId;
  summary.states = [stateName(task.status?.state)];

  while (task.status?.state === TaskState.TASK_STATE_INPUT_REQUIRED) {
    if (summary.replies.length >= MAX_REPLIES) throw new Error(`more than ${MAX_REPLIES} replies`);
    const asked = questionsOf(task.status)[0];
    const streamed = summary.replies.length % 2 === 1;
    let reply;
    if (asked.kind === "host_task") {
      if (!asked.system_prompt || !asked.user_prompt) throw new Error(`a host task without its prompt: ${JSON.stringify(asked)}`);
      reply = message(`[js output] ${asked.task_id}`, {
        taskId: task.id,
        contextId: task.contextId,
        metadata: { task_id: asked.task_id },
      });
      summary.replies.push({ kind: "host_task", id: asked.task_id, via: streamed ? "stream" : "send" });
    } else if (asked.kind === "gate") {
      if (!asked.choices || !("approve" in asked.choices)) throw new Error(`a gate without approve: ${JSON.stringify(asked)}`);
      reply = message("Approved from the JS client.", {
        taskId: task.id,
        contextId: task.contextId,
        metadata: { gate_id: asked.gate_id, decision: "approve" },
      });
      summary.replies.push({ kind: "gate", id: asked.gate_id, via: streamed ? "stream" : "send" });
    } else {
      throw new Error(`unknown question kind ${asked.kind}`);
    }
    task = streamed ? await sendStreaming(client, reply, counts) : await sendBlocking(client, reply, counts);
    if (task.id !== summary.task_id) throw new Error(`a reply answered with another task ${task.id}`);
    summary.states.push(stateName(task.status?.state));
  }
  summary.state = stateName(task.status?.state);
  summary.artifacts = artifactTexts(task.artifacts);

  const got = await client.getTask({ tenant: "", id: summary.task_id });
  summary.get_task = {
    id: got.id,
    context_id: got.contextId,
    state: stateName(got.status?.state),
    artifacts: artifactTexts(got.artifacts),
    construct_status: got.metadata?.construct_status,
  };
  if (args.protocol === "1.0") {
    // ListTasks is an A2A 1.0 method (0.3 had no tasks/list)
    const listed = await client.listTasks({ tenant: "", contextId, pageToken: "", status: 0, statusTimestampAfter: undefined });
    summary.listed = listed.tasks.map((t) => ({ id: t.id, state: stateName(t.status?.state) }));
  }
  return task.status?.state === TaskState.TASK_STATE_COMPLETED;
}

async function main() {
  const summary = { sdk: "@a2a-js/sdk", sdk_version: await sdkVersion(), node: process.version, replies: [], wire: [] };
  let ok = false;
  try {
    const args = parseArgs(process.argv.slice(2));
    summary.protocol_requested = args.protocol;
    ok = await drive(args, summary);
  } catch (error) {
    summary.error = `${error?.name ?? "Error"}: ${error?.message ?? String(error)}`;
    // a JSON-RPC error's code, or (for an HTTP refusal the SDK read as one) the body it got
    if (error?.envelopeCode !== undefined) summary.error_code = error.envelopeCode;
    if (error?.errorResponse !== undefined) summary.error_response = error.errorResponse;
    console.error(error);
  }
  process.stdout.write(JSON.stringify(summary, null, 2) + "\n");
  process.exitCode = ok ? 0 : 1;
}

await main();
