//! Graphviz rendering of a graph: op names, shapes, dtypes, and views that are not plain.

use crate::graph::GraphData;
use std::fmt::Write;

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}

/// Graphviz `dot` source for the live nodes of `graph`. Outputs have a double border; an
/// edge whose view is not the plain contiguous read of its input is labelled with the view.
pub fn to_dot(graph: &GraphData) -> String {
    let mut s = String::from("digraph luminal {\n  node [shape=box, fontname=\"monospace\"];\n");
    for id in graph.node_ids() {
        let node = graph.node(id);
        let dims: Vec<String> = node.shape.iter().map(|d| d.to_string()).collect();
        let label = format!(
            "{}\\n[{}] {}",
            escape(&node.op.name()),
            escape(&dims.join(", ")),
            node.dtype
        );
        let extra = if graph.outputs.contains(&id) {
            ", peripheries=2"
        } else {
            ""
        };
        let _ = writeln!(s, "  n{} [label=\"{}\"{}];", id.0, label, extra);
    }
    for id in graph.node_ids() {
        for (i, e) in graph.node(id).inputs.iter().enumerate() {
            let src = &graph.node(e.node).shape;
            let plain = e.view.is_contiguous() && &e.view.dims() == src;
            if plain {
                let _ = writeln!(s, "  n{} -> n{} [label=\"{}\"];", e.node.0, id.0, i);
            } else {
                let _ = writeln!(
                    s,
                    "  n{} -> n{} [label=\"{}: {}\"];",
                    e.node.0,
                    id.0,
                    i,
                    escape(&e.view.to_string())
                );
            }
        }
    }
    s.push_str("}\n");
    s
}
