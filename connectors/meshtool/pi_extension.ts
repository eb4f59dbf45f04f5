/**
 * cotal's mesh tools for pi (docs/mesh.md): `send`, `post`, `history` and `seats`, each one
 * call to the manager over the seat's own socket, `$COTAL_MESH_DIR/mesh.sock`.
 *
 * The pi connector loads this file with `--no-extensions -e <this file>` (pi 0.73.1 loads it
 * through jiti, so it needs no build step). It imports Node built-ins only: it runs from cotal's
 * checkout inside the seat's sandbox, where no node_modules of its own exist, and every
 * pi-specific shape it relies on (the factory, `registerTool`, a plain JSON Schema as
 * `parameters`, a thrown error as an error result) is pi's documented extension API.
 *
 * Each tool call opens one connection, writes one JSON line (a protocol/meshcall.py call, the
 * sender never named: the manager knows it from the peer) and reads one JSON line back. The
 * result line is the tool's text; a refused result is thrown, so pi marks it an error result,
 * as `code: message (cure)`.
 */

import * as fs from "node:fs";
import * as net from "node:net";

const MESH_DIR_ENV = "COTAL_MESH_DIR";
const SOCKET_NAME = "mesh.sock";
// sun_path holds 108 bytes with its terminating NUL: a longer path is reached through a
// descriptor of its directory, as connectors/meshclient.py does (the same rule, in Node).
const SUN_PATH_MAX = 107;
// meshclient.ANSWER_CAP: a history answer carries up to 1000 posts; past this the answer is
// refused, never buffered without bound.
const REPLY_CAP = 16 * 1024 * 1024;
// The manager answers a call at once or refuses it; a call that hangs this long is reported
// to the model rather than holding the turn.
const CALL_TIMEOUT_MS = 60_000;

type Call = Record<string, unknown>;
type ToolResult = { content: { type: "text"; text: string }[]; details: Record<string, unknown> };

interface ToolDefinition {
	name: string;
	label: string;
	description: string;
	promptSnippet?: string;
	parameters: Record<string, unknown>;
	execute(
		toolCallId: string,
		params: Record<string, unknown>,
		signal?: AbortSignal,
	): Promise<ToolResult>;
}

interface ExtensionAPI {
	registerTool(tool: ToolDefinition): void;
}

/** The socket path to connect to, and the directory fd to close once connected (or -1). */
function socketPath(): { path: string; dirFd: number } {
	const dir = process.env[MESH_DIR_ENV];
	if (!dir || !dir.startsWith("/")) {
		throw new Error(
			`mesh-unavailable: ${MESH_DIR_ENV} is not set to an absolute path in this seat's ` +
				"environment (start the seat under a cotal manager that serves the mesh socket)",
		);
	}
	const direct = `${dir.replace(/\/+$/, "")}/${SOCKET_NAME}`;
	if (Buffer.byteLength(direct) <= SUN_PATH_MAX) {
		return { path: direct, dirFd: -1 };
	}
	const dirFd = fs.openSync(dir, fs.constants.O_RDONLY | fs.constants.O_DIRECTORY);
	return { path: `/proc/self/fd/${dirFd}/${SOCKET_NAME}`, dirFd };
}

/** One call over one connection: the first JSON line back, parsed. */
function call(request: Call, signal?: AbortSignal): Promise<Record<string, unknown>> {
	return new Promise((resolve, reject) => {
		let target: { path: string; dirFd: number };
		try {
			target = socketPath();
		} catch (err) {
			reject(err);
			return;
		}
		const closeDir = (): void => {
			if (target.dirFd >= 0) {
				try {
					fs.closeSync(target.dirFd);
				} catch {
					// already closed: nothing holds it
				}
				target.dirFd = -1;
			}
		};
		const chunks: Buffer[] = [];
		let size = 0;
		let settled = false;
		const sock = net.createConnection({ path: target.path });
		const finish = (err: Error | null, value?: Record<string, unknown>): void => {
			if (settled) return;
			settled = true;
			clearTimeout(timer);
			signal?.removeEventListener("abort", onAbort);
			closeDir();
			sock.destroy();
			if (err) reject(err);
			else resolve(value as Record<string, unknown>);
		};
		const onAbort = (): void => finish(new Error("mesh-call-aborted: the tool call was aborted"));
		const timer = setTimeout(
			() =>
				finish(
					new Error(
						`mesh-timeout: the manager did not answer within ${CALL_TIMEOUT_MS / 1000} s ` +
							"(check the seat's manager with `cotal ps`)",
					),
				),
			CALL_TIMEOUT_MS,
		);
		if (signal?.aborted) {
			onAbort();
			return;
		}
		signal?.addEventListener("abort", onAbort, { once: true });
		sock.on("connect", () => {
			closeDir();
			sock.write(`${JSON.stringify(request)}\n`);
		});
		sock.on("data", (chunk: Buffer) => {
			const nl = chunk.indexOf(0x0a);
			const part = nl >= 0 ? chunk.subarray(0, nl) : chunk;
			size += part.length;
			if (size > REPLY_CAP) {
				finish(new Error(`mesh-reply-too-large: the manager's answer exceeds ${REPLY_CAP} bytes`));
				return;
			}
			chunks.push(part);
			if (nl < 0) return;
			let parsed: unknown;
			try {
				parsed = JSON.parse(Buffer.concat(chunks).toString("utf8"));
			} catch {
				finish(new Error("mesh-reply-invalid: the manager's answer is not a JSON line"));
				return;
			}
			if (typeof parsed !== "object" || parsed === null || Array.isArray(parsed)) {
				finish(new Error("mesh-reply-invalid: the manager's answer is not a JSON object"));
				return;
			}
			finish(null, parsed as Record<string, unknown>);
		});
		sock.on("end", () =>
			finish(new Error("mesh-unavailable: the manager closed the mesh socket without an answer")),
		);
		sock.on("error", (err: NodeJS.ErrnoException) =>
			finish(
				new Error(
					`mesh-unavailable: cannot reach the manager's mesh socket (${err.code ?? err.message}); ` +
						"the seat's manager may be gone",
				),
			),
		);
	});
}

async function run(request: Call, signal?: AbortSignal): Promise<ToolResult> {
	const result = await call(request, signal);
	if (result.status === "refused") {
		// Thrown, so pi hands the model an error result.
		throw new Error(`${String(result.code)}: ${String(result.message)} (${String(result.cure)})`);
	}
	return { content: [{ type: "text", text: JSON.stringify(result) }], details: result };
}

const SEAT = { type: "string", description: "a seat name of this space" };
const CHANNEL = { type: "string", description: "a channel name (without #)" };
const TEXT = { type: "string", description: "the message text (at most 128 KiB)" };

function tool(
	name: string,
	description: string,
	properties: Record<string, unknown>,
	required: string[],
	build: (params: Record<string, unknown>) => Call,
): ToolDefinition {
	return {
		name,
		label: `cotal ${name}`,
		description,
		promptSnippet: description,
		parameters: { type: "object", properties, required, additionalProperties: false },
		execute: (_id, params, signal) => run(build(params), signal),
	};
}

export default function cotalMesh(pi: ExtensionAPI): void {
	pi.registerTool(
		tool(
			"send",
			"Send a direct message to another seat of this cotal space, as this seat; it gets the " +
				"text as its next turn. Answers delivered, or an error naming why not.",
			{ to: SEAT, text: TEXT },
			["to", "text"],
			(p) => ({ op: "send", to: p.to, text: p.text }),
		),
	);
	pi.registerTool(
		tool(
			"post",
			"Post a message to a cotal channel, as this seat; its subscribers get it as a turn.",
			{ channel: CHANNEL, text: TEXT },
			["channel", "text"],
			(p) => ({ op: "post", channel: p.channel, text: p.text }),
		),
	);
	pi.registerTool(
		tool(
			"history",
			"Read the most recent posts of a cotal channel, oldest first.",
			{
				channel: CHANNEL,
				limit: { type: "integer", minimum: 1, maximum: 1000, description: "how many (default 20)" },
			},
			["channel"],
			(p) =>
				p.limit === undefined
					? { op: "history", channel: p.channel }
					: { op: "history", channel: p.channel, limit: p.limit },
		),
	);
	pi.registerTool(
		tool(
			"seats",
			"List the seats of this cotal space this seat may send to.",
			{},
			[],
			() => ({ op: "seats" }),
		),
	);
}
