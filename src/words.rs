//! Enums that are a list of words: each variant has the one word that the config, `--check`,
//! error messages and metric labels spell it with, written once.
//!
//! `words!` declares such an enum with `ALL` (every variant, in order), `as_str`, `FromStr` (whose
//! error lists the words: `must be "open", "closed" or "local", got "x"`) and `Display`.

/// `"a"`, `"a" or "b"`, `"a", "b" or "c"`: the words as an error message offers them.
pub fn choices(words: &[&str]) -> String {
    let quoted: Vec<String> = words.iter().map(|w| format!("{w:?}")).collect();
    match quoted.split_last() {
        None => String::new(),
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
    }
}

macro_rules! words {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident = $word:literal ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        $vis enum $name {
            $( $(#[$vmeta])* $variant ),+
        }

        impl $name {
            /// How many variants there are.
            pub const COUNT: usize = [$($word),+].len();

            /// Every variant, in declaration order.
            pub const ALL: [$name; $name::COUNT] = [$($name::$variant),+];

            /// The word for this variant.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $word),+
                }
            }

            /// Every word, in declaration order.
            pub fn words() -> impl Iterator<Item = &'static str> {
                Self::ALL.iter().map(|v| v.as_str())
            }
        }

        impl std::str::FromStr for $name {
            type Err = String;

            fn from_str(s: &str) -> Result<$name, String> {
                $name::ALL.iter().copied().find(|v| v.as_str() == s).ok_or_else(|| {
                    let words: Vec<&str> = $name::words().collect();
                    format!("must be {}, got {s:?}", $crate::words::choices(&words))
                })
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    words! {
        /// A test list.
        enum Colour {
            Red = "red",
            DarkBlue = "dark_blue",
            Green = "green",
        }
    }

    #[test]
    fn one_list_gives_every_spelling() {
        assert_eq!(Colour::ALL, [Colour::Red, Colour::DarkBlue, Colour::Green]);
        assert_eq!("dark_blue".parse::<Colour>(), Ok(Colour::DarkBlue));
        assert_eq!(Colour::Green.to_string(), "green");
        assert_eq!(
            "blue".parse::<Colour>(),
            Err("must be \"red\", \"dark_blue\" or \"green\", got \"blue\"".to_string())
        );
        assert_eq!(choices(&["a"]), "\"a\"");
        assert_eq!(choices(&["a", "b"]), "\"a\" or \"b\"");
    }
}
