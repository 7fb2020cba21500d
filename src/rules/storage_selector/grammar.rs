//! The part of CEL a storage selector may use: a condition over one storage's four variables.
//!
//! Comparisons, `&&`, `||`, `!`, arithmetic on numbers, `in` over a literal list, and the string
//! functions `startsWith`, `endsWith`, `contains`, `matches` and `size`. Macros (`all`, `exists`,
//! `exists_one`, `map`, `filter`, `has`) expand to comprehensions whose cost multiplies with each
//! level of nesting, so they are refused, as are maps, messages, field selection, indexing and the
//! conditional operator, which no condition over four plain variables needs. What is left
//! evaluates in time linear in the expression's length.

use cel::common::ast::{CallExpr, Expr};
use cel::parser::Expression;

/// What a selector may use, for the message that refuses the rest.
pub const ALLOWED: &str = "write a condition with ==, !=, <, <=, >, >=, &&, ||, !, arithmetic, `in [...]` over a list of literals, and startsWith, endsWith, contains, matches, size";

/// How deeply a selector may nest: far more than a condition over four variables needs, few enough
/// that walking and evaluating it stays shallow.
pub const MAX_DEPTH: usize = 32;

const OPERATORS: [&str; 16] = [
    "_&&_", "_||_", "!_", "_==_", "_!=_", "_<_", "_<=_", "_>_", "_>=_", "_+_", "_-_", "_*_", "_/_",
    "_%_", "-_", "@in",
];

const FUNCTIONS: [&str; 5] = ["startsWith", "endsWith", "contains", "matches", "size"];

/// Checks `expression` (nested `depth` deep) against the grammar; the error names the first thing
/// outside it.
pub fn walk(expression: &Expression, depth: usize) -> Result<(), String> {
    if depth > MAX_DEPTH {
        return Err(format!("more than {MAX_DEPTH} levels of nesting"));
    }
    match &expression.expr {
        Expr::Literal(_) | Expr::Ident(_) => Ok(()),
        Expr::Call(call) => call_allowed(call, depth),
        Expr::List(_) => Err("a list outside `in [...]`".to_string()),
        Expr::Comprehension(_) => Err("a macro (all, exists, exists_one, map, filter)".to_string()),
        Expr::Select(select) if select.test => Err("the macro has()".to_string()),
        Expr::Select(select) => Err(format!("the field selection `.{}`", select.field)),
        Expr::Map(_) => Err("a map".to_string()),
        Expr::Struct(_) => Err("a message".to_string()),
        Expr::Unspecified => Err("an empty expression".to_string()),
    }
}

fn call_allowed(call: &CallExpr, depth: usize) -> Result<(), String> {
    let name = call.func_name.as_str();
    if name == "@in" {
        return in_allowed(call, depth);
    }
    if !OPERATORS.contains(&name) && !FUNCTIONS.contains(&name) {
        return Err(match name {
            "_?_:_" => "the conditional operator ?:".to_string(),
            "_[_]" | "_[?_]" => "indexing [...]".to_string(),
            _ => format!("the function {name}()"),
        });
    }
    for operand in call.target.iter().map(|t| &**t).chain(&call.args) {
        walk(operand, depth + 1)?;
    }
    Ok(())
}

/// `x in [a, b, c]`: the list is written out, of literals only.
fn in_allowed(call: &CallExpr, depth: usize) -> Result<(), String> {
    let [item, list] = call.args.as_slice() else {
        return Err("`in` without two operands".to_string());
    };
    walk(item, depth + 1)?;
    match &list.expr {
        Expr::List(list)
            if list
                .elements
                .iter()
                .all(|e| matches!(e.expr, Expr::Literal(_))) =>
        {
            Ok(())
        }
        Expr::List(_) => Err("a list in `in [...]` with something other than literals".to_string()),
        _ => Err("`in` over something other than a list written out".to_string()),
    }
}
