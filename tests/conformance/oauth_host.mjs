// A remote host signing in with the TypeScript MCP SDK's OAuth client, then running a chain with a
// gate to its end: the flow of tests/acceptance/test_oidc_provider.py, from the other official SDK.
//
//   node oauth_host.mjs MCP_URL CLIENT_ID REDIRECT_URI LOGIN
//
// The SDK's StreamableHTTPClientTransport meets our 401, reads the protected-resource metadata and
// the provider's metadata and hands us the authorization URL; here a minimal browser (a cookie jar
// and the provider's two forms) signs LOGIN in and consents, the code goes to finishAuth, and the
// chain runs. Prints one JSON line: {"run_id", "status", "sign_ins"}.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { UnauthorizedError } from "@modelcontextprotocol/sdk/client/auth.js";

const [mcpUrl, clientId, redirectUri, login] = process.argv.slice(2);

class Host {
  constructor() {
    this.saved = undefined;
    this.verifier = undefined;
    this.authorizationUrl = undefined;
  }
  get redirectUrl() {
    return redirectUri;
  }
  get clientMetadata() {
    return { redirect_uris: [redirectUri], token_endpoint_auth_method: "none", client_name: "ts-host" };
  }
  clientInformation() {
    return { client_id: clientId, redirect_uris: [redirectUri], token_endpoint_auth_method: "none" };
  }
  tokens() {
    return this.saved;
  }
  saveTokens(tokens) {
    this.saved = tokens;
  }
  redirectToAuthorization(url) {
    this.authorizationUrl = url;
  }
  saveCodeVerifier(verifier) {
    this.verifier = verifier;
  }
  codeVerifier() {
    return this.verifier;
  }
}

// What a person's browser does: follow redirects with its cookies, sign in and consent on the
// provider's forms; returns the code the provider sends back to redirectUri.
async function browse(start) {
  const jar = new Map();
  const send = async (url, init = {}) => {
    const cookie = [...jar].map(([k, v]) => `${k}=${v}`).join("; ");
    const response = await fetch(url, { ...init, redirect: "manual", headers: { ...(init.headers ?? {}), cookie } });
    for (const line of response.headers.getSetCookie()) {
      const [pair] = line.split(";");
      const at = pair.indexOf("=");
      jar.set(pair.slice(0, at).trim(), pair.slice(at + 1).trim());
    }
    return response;
  };
  let response = await send(start);
  for (let hop = 0; hop < 12; hop++) {
    if (response.status === 302 || response.status === 303) {
      const next = new URL(response.headers.get("location"), response.url || start);
      if (next.href.startsWith(redirectUri)) {
        return next.searchParams.get("code");
      }
      response = await send(next);
      continue;
    }
    const page = await response.text();
    const form = page.match(/<form[^>]*action="([^"]*)"[^>]*>([\s\S]*?)<\/form>/);
    if (!form) {
      throw new Error(`no form at ${response.url}: ${response.status} ${page.slice(0, 300)}`);
    }
    const fields = new URLSearchParams();
    for (const tag of form[2].match(/<input[^>]*>/g) ?? []) {
      const name = tag.match(/name="([^"]*)"/);
      const value = tag.match(/value="([^"]*)"/);
      if (name) fields.set(name[1], value ? value[1].replaceAll("&amp;", "&") : "");
    }
    if (fields.has("login")) {
      fields.set("login", login);
      fields.set("password", "any");
    }
    const action = new URL(form[1].replaceAll("&amp;", "&"), response.url || start);
    response = await send(action, {
      method: "POST",
      body: fields.toString(),
      headers: { "content-type": "application/x-www-form-urlencoded" },
    });
  }
  throw new Error("the provider never sent the browser back");
}

const host = new Host();
let signIns = 0;

async function connected() {
  const client = new Client({ name: "ts-oauth-host", version: "1.0.0" });
  const transport = new StreamableHTTPClientTransport(new URL(mcpUrl), { authProvider: host });
  try {
    await client.connect(transport);
    return client;
  } catch (error) {
    if (!(error instanceof UnauthorizedError)) throw error;
    signIns += 1;
    await transport.finishAuth(await browse(host.authorizationUrl));
    const again = new Client({ name: "ts-oauth-host", version: "1.0.0" });
    await again.connect(new StreamableHTTPClientTransport(new URL(mcpUrl), { authProvider: host }));
    return again;
  }
}

const client = await connected();
let tool = "orchestrate_start";
let args = { request: "Signed in from TypeScript.", approve_before: ["engineer"] };
let view;
for (let step = 0; step < 20; step++) {
  const answer = await client.callTool({ name: tool, arguments: args });
  if (answer.isError) throw new Error(answer.content[0].text);
  view = answer.structuredContent;
  const action = view.next_action;
  if (action.kind === "none") break;
  tool = action.tool;
  args = { ...action.arguments };
  if (action.kind === "run_host_task") args.output = `[ts output] ${action.task_id}`;
  if (action.kind === "approve") args.decision = "approve";
}
await client.close();
console.log(JSON.stringify({ run_id: view.run_id, status: view.status, sign_ins: signIns }));
