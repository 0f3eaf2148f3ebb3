//! The help texts: the global one and one per command (`crossbar serve --help`), from one table so
//! the two never disagree. Pure text.

/// One command: name, arguments, one-line summary, longer description, the options it takes.
struct Command {
    name: &'static str,
    args: &'static str,
    summary: &'static str,
    about: &'static str,
    options: &'static [&'static str],
}

const CONFIG: &str = "-c, --config FILE     config file (default: ./crossbar.toml, else /etc/crossbar/crossbar.toml)";
const ADMIN: &str = "--admin ADDR          admin API, as 127.0.0.1:8081 or http://127.0.0.1:8081 (default: admin_listen from the config)";
const TOKEN: &str = "--token TOKEN         admin token (default: admin_token from the config)";
const JSON: &str = "--json                the admin API's JSON instead of a table";
const HOSTS: &str = "--hosts               also ask each host: its slots from /props, and (idle) a probe of its similarity and RAM cache";

const COMMANDS: &[Command] = &[
    Command {
        name: "serve",
        args: "",
        summary: "run the gateway",
        about: "Serves clients on `listen` and the admin API, /metrics, /livez, /readyz and the status\n\
                page on `admin_listen`. SIGHUP re-reads the config; SIGTERM or SIGINT stops, letting\n\
                streams finish within `shutdown_grace`. Logs one line per request on stderr.",
        options: &[CONFIG],
    },
    Command {
        name: "check",
        args: "",
        summary: "validate the config; prints ok or every problem",
        about: "Reads the config as `serve` would and prints `ok`, or one line per problem naming its\n\
                key (exit 1). Also fails when the db's directory is not writable, and notes a db\n\
                that a running crossbar holds. Asks no host unless --hosts: then each host's\n\
                slots, similarity and RAM cache are checked against what the config says.",
        options: &[CONFIG, HOSTS],
    },
    Command {
        name: "status",
        args: "",
        summary: "hosts, slots, routes and pins",
        about: "Asks the running crossbar's admin API for hosts (state, context, busy slots, queue,\n\
                leases, loaded models) and routes (model, pin, leases).",
        options: &[CONFIG, ADMIN, TOKEN, JSON],
    },
    Command {
        name: "leases",
        args: "",
        summary: "conversation leases",
        about: "Lists every conversation lease (route, conversation, model, host, idle time) and the pins.",
        options: &[CONFIG, ADMIN, TOKEN, JSON],
    },
    Command {
        name: "pin",
        args: " ROUTE HOST",
        summary: "send every conversation of ROUTE to HOST",
        about: "Pins ROUTE to HOST: every conversation of the route goes there now; leases on other\n\
                hosts are dropped.",
        options: &[CONFIG, ADMIN, TOKEN],
    },
    Command {
        name: "unpin",
        args: " ROUTE",
        summary: "remove the pin (leases stay where they are)",
        about: "Removes ROUTE's pin; its leases stay where they are.",
        options: &[CONFIG, ADMIN, TOKEN],
    },
    Command {
        name: "release",
        args: " ROUTE",
        summary: "drop the route's leases (the pin stays)",
        about: "Drops every lease of ROUTE; each conversation is placed afresh on its next turn.",
        options: &[CONFIG, ADMIN, TOKEN],
    },
    Command {
        name: "drain",
        args: " HOST [--off]",
        summary: "give HOST no new leases (its leases stay); --off ends it",
        about: "Gives HOST no new leases; the conversations already on it stay. --off ends the drain.",
        options: &[CONFIG, ADMIN, TOKEN, "--off                 end the drain"],
    },
    Command {
        name: "report",
        args: " [--since DUR] [--route R] [--by key] [--json]",
        summary: "requests, tokens and cache hits per route and host (reads the db)",
        about: "Reads the db named in the config: requests, tokens, cached-token share and TTFB per\n\
                route and host.",
        options: &[
            CONFIG,
            "--since DUR           how far back, e.g. 30m, 24h, 7d (default: 24h)",
            "--route R             only route R",
            "--by key              one line per client key instead",
            "--json                JSON instead of a table",
        ],
    },
    Command {
        name: "key",
        args: " new NAME",
        summary: "make a client key: prints it once, with the lines for crossbar.toml",
        about: "Prints a fresh random key (256 bits) and the [keys.NAME] lines to paste into\n\
                crossbar.toml; crossbar keeps only its SHA-256. Clients send it as\n\
                Authorization: Bearer, x-api-key or api-key. Rotate: add a new key, hand it out,\n\
                remove the old one, reload.",
        options: &[],
    },
    Command {
        name: "backup",
        args: " FILE",
        summary: "a verified copy of the db, safe while serve runs",
        about: "Copies the db named in the config to FILE with SQLite's online backup API (while\n\
                `serve` runs, too), checks the copy (integrity_check, lease and request counts) and\n\
                only then gives it its name. Never overwrites FILE.",
        options: &[CONFIG],
    },
];

/// `crossbar --help`.
pub fn global() -> String {
    let mut out = format!(
        "crossbar {} — a sticky, cache-aware gateway for llama-server hosts\n\n\
         usage: crossbar <command> [options]\n       crossbar <command> --help\n\ncommands:\n",
        env!("CARGO_PKG_VERSION")
    );
    for c in COMMANDS {
        let head = format!("{}{}", c.name, c.args);
        if head.len() <= 21 {
            out.push_str(&format!("  {head:<22}{}\n", c.summary));
        } else {
            out.push_str(&format!("  {head}\n  {:<22}{}\n", "", c.summary));
        }
    }
    out.push_str(&format!(
        "\noptions:\n  {CONFIG}\n  -h, --help            this text, or a command's own\n  -V, --version         the version\n"
    ));
    out
}

/// `crossbar COMMAND --help`; `None` for a command that does not exist.
pub fn command(name: &str) -> Option<String> {
    let c = COMMANDS.iter().find(|c| c.name == name)?;
    let mut out = format!(
        "crossbar {} — {}\n\nusage: crossbar {}{} [options]\n\n{}\n\noptions:\n",
        c.name, c.summary, c.name, c.args, c.about
    );
    for option in c.options {
        out.push_str(&format!("  {option}\n"));
    }
    out.push_str("  -h, --help            this text\n");
    Some(out)
}
