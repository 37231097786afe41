// Server-Sent Events over fetch: a ReadableStream read chunk by chunk and
// parsed as the HTML standard says (EventSource cannot POST or send a header).

// Yields {id, type, data} for each event of a response's body.
export async function* sseEvents(response) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  let data = [];
  let type = "";
  let id = null;
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      let text = buffer + value;
      let held = "";
      if (text.endsWith("\r")) {
        held = "\r"; // maybe the first half of \r\n
        text = text.slice(0, -1);
      }
      const lines = text.split(/\r\n|\n|\r/);
      buffer = lines.pop() + held;
      for (const line of lines) {
        if (line === "") {
          if (data.length) yield { id, type: type || "message", data: data.join("\n") };
          data = [];
          type = "";
          continue;
        }
        if (line.startsWith(":")) continue; // a comment: the server's keep-alive
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        let val = colon < 0 ? "" : line.slice(colon + 1);
        if (val.startsWith(" ")) val = val.slice(1);
        if (field === "data") data.push(val);
        else if (field === "event") type = val;
        else if (field === "id" && !val.includes("\0")) id = val;
      }
    }
  } finally {
    reader.cancel().catch(() => {});
  }
}
